"""Host cost of one steady decode step of the scheduler (schedule + update), pure Python, no model.

`batch` requests with a `ctx`-token prompt are prefilled (untimed), then `steps` decode steps are
timed, each `schedule()` + `update()` with every sampled token a constant non-stop id; the figure
is the median microseconds per step. This is the host work an engine step serialises with the
GPU's forward (issue 12), so it is the number to keep small per running request. Prints JSON.

    python -m benchmarks.scheduler_host [--batches 1 32 128] [--ctx 2000] [--steps 400]
    python -m benchmarks.scheduler_host --profile 128   # plus a cProfile of batch 128 (stderr)
    python -m benchmarks.scheduler_host --engine        # the whole `Engine.step` (outputs, text)
    PYTHONPATH=/path/to/other/checkout python -m benchmarks.scheduler_host  # that code's figures

"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import time
from collections.abc import Callable

from inference.cache.coordinator import CacheConfig
from inference.engine.request import Request, SamplingParams
from inference.engine.scheduler import Scheduler, SchedulerConfig


def make_scheduler(batch: int, ctx: int) -> Scheduler:
    """A scheduler whose `batch` requests have all finished their prefill."""
    sched = Scheduler(
        SchedulerConfig(max_num_seqs=256, max_num_batched_tokens=8192, max_model_len=1 << 20),
        CacheConfig(
            block_size=64, num_blocks=200_000, num_state_slots=4 * batch + 8, checkpoint_interval=1024
        ),
    )
    for i in range(batch):
        prompt = [(i * 7 + j) % 1000 for j in range(ctx)]
        sched.add(Request(f"r{i}", prompt, SamplingParams(temperature=0.0, max_tokens=100_000)))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in sched.requests.values()):
        out = sched.schedule()
        sched.update(out, {s.req_id: 5 for s in out.scheduled if s.sample})
    return sched


def _median_us(step: Callable[[], object], steps: int, profile: bool) -> float:
    """Median microseconds of `steps` calls of `step` (`profile`: under cProfile, to stderr)."""
    prof = cProfile.Profile() if profile else None
    times = []
    if prof is not None:
        prof.enable()
    for _ in range(steps):
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    if prof is not None:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(20)
    return 1e6 * statistics.median(times)


def decode_us_per_step(batch: int, ctx: int, steps: int, profile: bool = False) -> float:
    sched = make_scheduler(batch, ctx)

    def step() -> None:
        out = sched.schedule()
        sched.update(out, {s.req_id: 5 for s in out.scheduled if s.sample})

    return _median_us(step, steps, profile)


def make_engine(batch: int, ctx: int):
    """An `Engine` with no model (its runner samples one fixed token) whose `batch` requests have
    finished their prefill: `Engine.step` is then the engine's whole host work of a decode step
    (schedule, update, detokenise and stop strings, outputs) but the runner's tensors."""
    from types import SimpleNamespace

    from benchmarks.engine_turns import NoForward
    from inference.engine.engine import Engine, EngineConfig
    from inference.tokenizer import ByteTokenizer

    cfg = EngineConfig.of(
        block_size=64, num_blocks=batch * (ctx + 4096) // 64 + 64, num_state_slots=4 * batch + 8,
        checkpoint_interval=1024, max_num_seqs=max(batch, 1), max_num_batched_tokens=8192,
        max_model_len=1 << 20, enable_cuda_graphs=False,
    )  # fmt: skip
    spec = SimpleNamespace(kv_bytes_per_token=1, state_bytes_per_slot=1)
    eng = Engine(None, ByteTokenizer(), cfg, cache_spec=spec, runner=NoForward())
    for i in range(batch):
        prompt = [(i * 7 + j) % 250 for j in range(ctx)]
        eng.add_request(prompt, SamplingParams(temperature=0.0, max_tokens=100_000, ignore_eos=True))
    while any(r.num_computed_tokens < r.num_prompt_tokens for r in eng.scheduler.requests.values()):
        eng.step()
    return eng


def engine_us_per_step(batch: int, ctx: int, steps: int, profile: bool = False) -> float:
    return _median_us(make_engine(batch, ctx).step, steps, profile)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32, 128])
    ap.add_argument("--ctx", type=int, default=2000, help="prompt tokens per request")
    ap.add_argument("--steps", type=int, default=400, help="timed decode steps per batch size")
    ap.add_argument("--no-gc", action="store_true", help="disable the garbage collector while timing")
    ap.add_argument("--profile", type=int, default=0, metavar="BATCH", help="cProfile 100 steps of BATCH")
    ap.add_argument("--engine", action="store_true", help="time Engine.step (no model), not the scheduler")
    args = ap.parse_args()
    if args.no_gc:
        gc.disable()
    timed = engine_us_per_step if args.engine else decode_us_per_step
    us = {str(b): round(timed(b, args.ctx, args.steps), 1) for b in args.batches}
    result = {
        "us_per_step": us,
        "us_per_request": {b: round(v / int(b), 2) for b, v in us.items()},
        "ctx": args.ctx,
        "steps": args.steps,
        "timed": "Engine.step" if args.engine else "Scheduler.schedule + update",
        "load_avg_1m": os.getloadavg()[0],
    }
    print(json.dumps(result))
    if args.profile:
        timed(args.profile, args.ctx, 100, profile=True)


if __name__ == "__main__":
    main()

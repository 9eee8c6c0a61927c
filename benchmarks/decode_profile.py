"""Where a decode step's wall time goes (issue 12, "batch-1 profile"): host phases vs GPU kernels.

For each batch size the engine of `benchmarks/engine.py` (2.77B Kimi-Linear-shaped config, bf16,
CUDA graphs, 128-token prompts) decodes `--steps` timed steps twice:

1. Host phases, timed with `perf_counter` around the engine's own calls (scheduler.schedule, the
   runner's decode batch build, the graph input copy, the graph replay launch, the wait for the
   GPU after the replay, the sampler, scheduler.update, detokenise/stop strings; "other" is the
   rest of `Engine.step`), plus the GPU time of each graph replay from CUDA events around it.
2. The same steps under `torch.profiler` with CUDA activities: kernels per step, kernel busy time,
   the GPU span per step and the idle gaps inside it, and the top-20 kernels by time.

One eager (no graphs) forward is also profiled for the ATen ops that launch the kernels (which op
a small kernel belongs to). Prints JSON and writes `$OUT/decode_profile.json`.

    python -m benchmarks.decode_profile                  # CUDA: the benchmark config
    python -m benchmarks.decode_profile --quick          # CPU smoke run with the bundled small model
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from benchmarks.engine_setup import BATCHED_TOKENS, _warm, bench_config, make_engine, rand_prompts
from inference.config import parse_config
from inference.engine import cuda_graphs, stops
from inference.engine.engine import Engine
from inference.engine.factory import small_model_config
from inference.engine.request import SamplingParams
from inference.model.factory import build_model


class Phases:
    """Accumulated host seconds per named phase (and CUDA event pairs around graph replays)."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)
        self.replay_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.on = False

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            if not self.on:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1

        return timed


@contextlib.contextmanager
def instrumented(eng: Engine, ph: Phases) -> Iterator[None]:
    """Wrap the engine's calls of one decode step in `ph`'s timers (undone on exit)."""
    runner, sched = eng.runner, eng.scheduler
    saved_cls = [
        (cuda_graphs.DecodeInputs, "load", cuda_graphs.DecodeInputs.load),
        (cuda_graphs.DecodeGraphs, "_replay", cuda_graphs.DecodeGraphs._replay),
        (stops.TextStops, "step", stops.TextStops.step),
    ]
    saved_inst = [(obj, name, getattr(obj, name), name in vars(obj)) for obj, name in (
        (sched, "schedule"), (sched, "update"), (runner, "_graph_batch"), (runner, "sampler"),
        (eng, "step"), (runner, "execute"),
    )]  # fmt: skip
    sampler = runner.sampler  # not called on all-greedy graph steps (the graph's argmax is read)

    def replay(self_: cuda_graphs.DecodeGraphs, g: Any) -> Any:
        if not (ph.on and ph.cuda):
            return saved_cls[1][2](self_, g)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        t0 = time.perf_counter()
        out = saved_cls[1][2](self_, g)
        b.record()
        ph.seconds["graph_replay_launch"] += time.perf_counter() - t0
        ph.calls["graph_replay_launch"] += 1
        ph.replay_events.append((a, b))
        # the wait that the tokens' read-back (.tolist()) does anyway, timed apart: nothing but
        # indexing runs on the host between the replay and that read-back
        t0 = time.perf_counter()
        b.synchronize()
        ph.seconds["wait_gpu_after_replay"] += time.perf_counter() - t0
        return out

    try:
        cuda_graphs.DecodeInputs.load = ph.wrap("graph_inputs_h2d", saved_cls[0][2])
        cuda_graphs.DecodeGraphs._replay = replay
        stops.TextStops.step = ph.wrap("detokenise_stops", saved_cls[2][2])
        sched.schedule = ph.wrap("scheduler_schedule", saved_inst[0][2])
        sched.update = ph.wrap("scheduler_update", saved_inst[1][2])
        runner._graph_batch = ph.wrap("runner_graph_batch", saved_inst[2][2])
        runner.sampler = ph.wrap("sampler", sampler)
        eng.step = ph.wrap("step_total", saved_inst[4][2])
        runner.execute = ph.wrap("runner_execute", saved_inst[5][2])
        yield
    finally:
        for cls, name, fn in saved_cls:
            setattr(cls, name, fn)
        for obj, name, fn, own in saved_inst:
            if own:
                setattr(obj, name, fn)
            else:
                delattr(obj, name)  # back to the class's method


def host_phases(eng: Engine, device: torch.device, steps: int) -> dict[str, Any]:
    ph = Phases(device.type == "cuda")
    with instrumented(eng, ph):
        ph.on = True
        if ph.cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        tokens = sum(len(o.new_token_ids) for _ in range(steps) for o in eng.step())
        if ph.cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
        ph.on = False
    sec = dict(ph.seconds)
    inside = ("runner_graph_batch", "graph_inputs_h2d", "graph_replay_launch",
              "wait_gpu_after_replay", "sampler")  # fmt: skip
    top = ("scheduler_schedule", "runner_execute", "scheduler_update", "detokenise_stops")
    sec["runner_execute_other"] = sec.get("runner_execute", 0.0) - sum(sec.get(k, 0.0) for k in inside)
    sec["step_other"] = sec.get("step_total", 0.0) - sum(sec.get(k, 0.0) for k in top)
    per = {k: round(1000 * v / steps, 4) for k, v in sorted(sec.items())}
    res: dict[str, Any] = {
        "steps": steps, "tokens": tokens, "wall_ms_per_step": round(1000 * wall / steps, 4),
        "tok_per_s": round(tokens / wall, 1), "host_ms_per_step": per,
        "nesting": "step_total = scheduler_schedule + runner_execute + scheduler_update + "
        "detokenise_stops + step_other; runner_execute = runner_graph_batch + graph_inputs_h2d + "
        "graph_replay_launch + wait_gpu_after_replay + sampler + runner_execute_other",
    }  # fmt: skip
    if ph.replay_events:
        torch.cuda.synchronize()
        gpu = [a.elapsed_time(b) for a, b in ph.replay_events]
        res["graph_replay_gpu_ms"] = {"mean": round(sum(gpu) / len(gpu), 4), "min": round(min(gpu), 4)}
    return res


def _kernel_events(prof: Any) -> list[Any]:
    return [e for e in prof.events() if e.device_type.name == "CUDA" and e.time_range.elapsed_us() >= 0]


def kernel_profile(eng: Engine, device: torch.device, steps: int) -> dict[str, Any]:
    """Kernels of `steps` engine steps (graph replays included: CUPTI reports their kernels)."""
    from torch.profiler import ProfilerActivity, profile

    if device.type != "cuda":
        return {"note": "no CUDA device: no kernel profile"}
    torch.cuda.synchronize()
    marks: list[tuple[float, float]] = []
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        torch.cuda.synchronize()
    kern = _kernel_events(prof)
    if not kern:
        return {"note": "the profiler recorded no kernels"}
    kern.sort(key=lambda e: e.time_range.start)
    busy = sum(e.time_range.elapsed_us() for e in kern)
    # steps are separated by the host's sampling sync: split the kernel stream at its largest gaps
    gaps = sorted(
        ((kern[i + 1].time_range.start - kern[i].time_range.end, i) for i in range(len(kern) - 1)),
        reverse=True,
    )
    cuts = sorted(i for _, i in gaps[: steps - 1])
    spans, lo = [], 0
    for c in [*cuts, len(kern) - 1]:
        part = kern[lo : c + 1]
        spans.append((part[0].time_range.start, part[-1].time_range.end, len(part),
                      sum(e.time_range.elapsed_us() for e in part)))  # fmt: skip
        lo = c + 1
    marks = [(s, e) for s, e, _, _ in spans]
    span_us = sum(e - s for s, e in marks)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for e in kern:
        row = by_name[e.name]
        row[0] += 1
        row[1] += e.time_range.elapsed_us()
    top = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:20]
    between = [spans[i + 1][0] - spans[i][1] for i in range(len(spans) - 1)]
    return {
        "steps": steps,
        "kernels_per_step": round(len(kern) / steps, 1),
        "kernel_busy_ms_per_step": round(busy / steps / 1000, 4),
        "gpu_span_ms_per_step": round(span_us / steps / 1000, 4),
        "idle_inside_span_ms_per_step": round((span_us - busy) / steps / 1000, 4),
        "gpu_idle_between_steps_ms": round(sum(between) / max(1, len(between)) / 1000, 4),
        "top20_kernels": [
            {
                "name": n[:120],
                "per_step": round(c / steps, 2),
                "us_per_step": round(t / steps, 2),
                "mean_us": round(t / c, 2),
            }
            for n, (c, t) in top
        ],
    }


def eager_ops(model: torch.nn.Module, spec: Any, dtype: torch.dtype, device: torch.device, batch: int) -> Any:
    """ATen ops (calls per forward, with their kernel time) of one eager pure-decode forward."""
    from torch.profiler import ProfilerActivity, profile

    eng = make_engine(model, spec, dtype, device, enable_cuda_graphs=False, num_state_slots=2 * batch + 8)
    for p in rand_prompts(batch, 128, 9):
        eng.add_request(p, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    _warm(eng)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        eng.step()
        if device.type == "cuda":
            torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.key.startswith("aten::") and e.count:
            rows.append({"op": e.key, "calls": e.count, "self_device_us": round(e.self_device_time_total, 1)})
    rows.sort(key=lambda r: (-r["calls"], -r["self_device_us"]))
    kern = _kernel_events(prof)
    return {"batch": batch, "kernels": len(kern), "aten_ops_by_calls": rows[:30]}


def profile_batch(
    model, spec, dtype, device, batch: int, steps: int, prompt_len: int = 128
) -> dict[str, Any]:
    # requests done with their prompts decode while the others prefill: room for those tokens too
    max_tokens = 3 * steps + 60 + -(-batch * prompt_len // BATCHED_TOKENS)
    eng = make_engine(
        model, spec, dtype, device, num_state_slots=2 * batch + 8,
        num_blocks=batch * ((prompt_len + max_tokens + 80) // 64 + 2),
        max_model_len=max(40000, prompt_len + max_tokens + 64),
    )  # fmt: skip
    for p in rand_prompts(batch, prompt_len, 7):
        eng.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    _warm(eng)
    res = {"batch": batch, "prompt_len": prompt_len, "host": host_phases(eng, device, steps)}
    res["kernels"] = kernel_profile(eng, device, min(steps, 16))
    res["host_again"] = host_phases(eng, device, steps)  # after the profiler: steady state again
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="CPU smoke run with the bundled small model")
    ap.add_argument("--batches", default="1,32")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=128, help="context each request decodes after")
    args = ap.parse_args()
    quick = args.quick or not torch.cuda.is_available()
    device = torch.device("cpu" if quick else "cuda")
    dtype = torch.float32 if quick else torch.bfloat16
    if quick:
        torch.set_num_threads(1)
    cfg = small_model_config() if quick else bench_config()
    spec = parse_config(cfg)
    model = build_model(spec, load_format="dummy", dtype=torch.float32, device=device, seed=0)
    for name, p in model.named_parameters():  # as benchmarks/engine.py: decay parameters stay fp32
        if not name.endswith(("A_log", "dt_bias")):
            p.data = p.data.to(dtype)
    out: dict[str, Any] = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__, "dtype": str(dtype),
        "kernels_env": os.environ.get("DAYZERO_KERNELS", "fast"),
    }  # fmt: skip
    steps = 4 if quick else args.steps
    plen = 32 if quick else args.prompt_len
    for b in (int(x) for x in args.batches.split(",")):
        out[f"b{b}"] = profile_batch(model, spec, dtype, device, b, steps, plen)
        out[f"b{b}"]["eager_forward_ops"] = eager_ops(model, spec, dtype, device, b)
        print(json.dumps({f"b{b}": out[f"b{b}"]}, indent=1), flush=True)
    if d := os.environ.get("OUT"):
        Path(d, f"decode_profile_{plen}.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

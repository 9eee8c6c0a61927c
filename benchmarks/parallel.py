"""Parallel-engine benchmark (issue 19): decode tok/s at batch 32 / 128, prefill of a 32K prompt,
the time of each collective per decode step (torch profiler), the collective and point-to-point
traffic per step (calls and payload bytes of each op on each rank, from the ranks' own counters:
`inference/parallel/comm.py`), with pipeline stages each rank's busy fraction in steady decode,
and each rank's memory beside `dayzero analyze`'s per-GPU cache figures, at any world size
(TP x EP x PP).

Model: `benchmarks/engine.py`'s 2.7B Kimi-Linear-shaped random config (16 heads for KDA and MLA,
32 experts), bf16. World size 1 runs today's single-GPU path (CUDA graphs on, no worker process);
above 1 the engine starts one worker per rank (NCCL; graphs not built under TP/EP yet).

    python -m benchmarks.parallel --tp 1 --out $OUT              # one GPU: the TP=1 baseline
    python -m benchmarks.parallel --tp 2 --ep 1 --out $OUT       # 2 GPUs
    python -m benchmarks.parallel --tp 4 --ep 2 --out $OUT       # 8 GPUs
    python -m benchmarks.parallel --quick --tp 2 --ep 2          # CPU smoke run (gloo, tiny model)
    python -m benchmarks.parallel --quick --pp 2 --tp 2 --sections traffic  # traffic per step
    python -m benchmarks.parallel --plot a.json b.json --out .   # decode/prefill chart of runs

Writes `parallel_tp{T}_ep{E}[_pp{P}].json` (and with --plot `parallel.png`).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import time
import traceback
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]

from inference.engine.engine import EngineConfig  # noqa: E402
from inference.engine.factory import build_engine, small_model_config  # noqa: E402
from inference.engine.request import SamplingParams  # noqa: E402

COLLECTIVE_KEYS = ("dayzero.", "nccl", "gloo", "c10d::", "allreduce", "all_gather", "alltoall")


def bench_config() -> dict[str, Any]:
    """The 2.7B config of benchmarks/engine.py (one definition: imported from there)."""
    spec = importlib.util.spec_from_file_location("bench_engine", ROOT / "benchmarks" / "engine.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.bench_config()


def sync(eng) -> None:
    """Wait for the GPU; a parallel engine's step has returned only once rank 0's tokens were
    read back (the driver holds no CUDA context and must not make one)."""
    if eng.runner.device.type == "cuda" and getattr(eng.runner, "world_size", 1) == 1:
        torch.cuda.synchronize()


def rand_prompts(n: int, length: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(256) for _ in range(length)] for _ in range(n)]


def make_engine(args, cfg: dict[str, Any], **kw):
    ec = EngineConfig.of(
        **{
            **dict(
                block_size=64, num_blocks=args.num_blocks, num_state_slots=2 * max(args.batches) + 16,
                max_num_seqs=max(args.batches), max_num_batched_tokens=args.chunk,
                max_model_len=args.prefill + 512, checkpoint_interval=32768,
            ),
            **kw,
        }
    )  # fmt: skip
    return build_engine(
        config=cfg, engine_config=ec, device=args.device, dtype=args.dtype, fixed_blocks=True,
        tensor_parallel_size=args.tp, expert_parallel_size=args.ep, expert_dispatch=args.expert_dispatch,
        pipeline_parallel_size=args.pp, micro_batches=args.micro_batches,
    )  # fmt: skip


def _until_decoding(eng, batch: int, prompt_len: int, max_tokens: int) -> None:
    for p in rand_prompts(batch, prompt_len, 7):
        eng.add_request(p, SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True))
    while any(r.num_output_tokens == 0 for r in eng.scheduler.requests.values()):
        eng.step()
    for _ in range(3):
        eng.step()


def decode(eng, args, batch: int) -> dict[str, Any]:
    _until_decoding(eng, batch, args.prompt, args.steps + 40)
    sync(eng)
    t0 = time.perf_counter()
    n = sum(len(o.new_token_ids) for _ in range(args.steps) for o in eng.step())
    sync(eng)
    dt = time.perf_counter() - t0
    eng.abort(list(eng.scheduler.requests))
    return {
        "batch": batch,
        "tokens": n,
        "tok_per_s": round(n / dt, 1),
        "ms_per_step": round(1000 * dt / args.steps, 3),
    }


def prefill(eng, args) -> dict[str, Any]:
    """TTFT of one `args.prefill`-token prompt in `args.chunk`-token chunks, after a warm-up chunk."""
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    eng.generate(rand_prompts(1, min(args.chunk, args.prefill), 3), sp)  # compile / autotune
    sync(eng)
    t0 = time.perf_counter()
    eng.generate(rand_prompts(1, args.prefill, 4), sp)
    sync(eng)
    dt = time.perf_counter() - t0
    return {
        "tokens": args.prefill,
        "chunk": args.chunk,
        "ttft_s": round(dt, 3),
        "tok_per_s": round(args.prefill / dt, 1),
    }


def _profile_rows(eng, steps: int) -> list[dict[str, Any]]:
    def run() -> None:
        for _ in range(steps):
            eng.step()
        sync(eng)

    profile = getattr(eng.runner, "profile", None)
    if profile is not None:  # world size > 1: rank 0's profiler
        return profile(run)
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if eng.runner.device.type == "cuda" else [])
    with torch_profile(activities=acts) as prof:
        run()
    return [
        {"name": e.key, "count": e.count, "cpu_total_us": e.cpu_time_total,
         "device_total_us": getattr(e, "device_time_total", 0.0)}
        for e in prof.key_averages()
    ]  # fmt: skip


def collectives(eng, args, batch: int) -> dict[str, Any]:
    """Per decode step: calls and time of each collective (labels `dayzero.<layer>.<op>` around
    the calls, and the backend's own ops/kernels); eager steps, rank 0's view."""
    _until_decoding(eng, batch, args.prompt, 3 * args.profile_steps + 40)
    rows = _profile_rows(eng, args.profile_steps)
    eng.abort(list(eng.scheduler.requests))
    per = args.profile_steps
    picked = [r for r in rows if any(k in r["name"].lower() for k in COLLECTIVE_KEYS)]
    return {
        "batch": batch,
        "steps": per,
        "per_step": {
            r["name"]: {
                "calls": r["count"] / per,
                "cpu_ms": round(r["cpu_total_us"] / per / 1000, 4),
                "device_ms": round(r["device_total_us"] / per / 1000, 4),
            }
            for r in sorted(picked, key=lambda r: -max(r["device_total_us"], r["cpu_total_us"]))
        },
    }


def _traffic_of(ranks: list[dict[str, list[int]]], steps: int) -> dict[str, Any]:
    per_rank = [
        {k: {"calls": c / steps, "bytes": b / steps} for k, (c, b) in sorted(r.items())} for r in ranks
    ]
    total: dict[str, list[float]] = {}
    for r in ranks:
        for k, (c, b) in r.items():
            t = total.setdefault(k, [0, 0])
            t[0] += c / steps
            t[1] += b / steps
    return {
        "per_rank": per_rank,
        "all_ranks": {k: {"calls": c, "bytes": b} for k, (c, b) in sorted(total.items())},
        "all_ranks_bytes": sum(b for _, b in total.values()),
    }


def traffic(eng, args, batch: int) -> dict[str, Any]:
    """Per decode step at `batch` sequences, and per prefill chunk of `args.chunk` tokens: each
    rank's collective and point-to-point calls and payload bytes by `<label>.<op>` (an
    all-reduce's tensor, an all-gather's or all-to-all's sent part, a stage's activations sent and
    received), and their sum over the ranks. Eager steps are counted exactly; under CUDA graphs a
    replayed op is not seen. World size 1: no traffic."""
    take = getattr(eng.runner, "traffic", None)
    if take is None:
        return {"batch": batch, "note": "world size 1: no collectives"}
    _until_decoding(eng, batch, args.prompt, args.profile_steps + 40)
    take()  # start counting here
    for _ in range(args.profile_steps):
        eng.step()
    decode_traffic = _traffic_of(take(), args.profile_steps)
    eng.abort(list(eng.scheduler.requests))
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    take()
    eng.generate(rand_prompts(1, args.chunk, 5), sp)  # one chunk, sampled once
    return {
        "batch": batch,
        "steps": args.profile_steps,
        "decode_per_step": decode_traffic,
        "prefill_chunk_tokens": args.chunk,
        "prefill_per_chunk": _traffic_of(take(), 1),
    }


def stages(eng, args, batch: int) -> dict[str, Any]:
    """Pipeline stages in steady decode at `batch` sequences: steps in flight at once, and each
    rank's busy fraction over the timed steps (its step spans, less the time it waited for a
    neighbouring stage's activations, over the wall time from the first start to the last end);
    with one step per stage in flight no stage should wait for another."""
    spans = getattr(eng.runner, "spans", None)
    if spans is None or getattr(eng, "depth", 1) == 1:
        return {"batch": batch, "note": "no pipeline stages"}
    _until_decoding(eng, batch, args.prompt, args.steps + 40)
    for r in spans:
        r.clear()
    for _ in range(args.steps):
        eng.step()
    eng.abort(list(eng.scheduler.requests))
    while eng.has_unfinished:  # the steps still in flight
        eng.step()
    rows = [list(r) for r in spans]
    start = min(a for r in rows for _, a, _, _ in r)
    end = max(b for r in rows for _, _, b, _ in r)
    return {
        "batch": batch,
        "steps": args.steps,
        "max_steps_in_flight": eng.max_in_flight,
        "busy_fraction_per_rank": [
            round(sum(b - a - w for _, a, b, w in r) / (end - start), 3) for r in rows
        ],
        "waiting_fraction_per_rank": [round(sum(w for *_, w in r) / (end - start), 3) for r in rows],
    }


def memory(eng, cfg: dict[str, Any], args) -> dict[str, Any]:
    """Per-rank bytes the runtime holds, beside `dayzero analyze`'s per-GPU figures (its count of
    this mesh's shard by the split rule, in the run's dtype; bf16 KV, at this TP): weights, KV and
    state pools, bytes per token / per slot."""
    from inference.analyze.params import cache_bytes
    from inference.analyze.plan import _kv_per_gpu, driver_params, rank_params
    from inference.config import parse_config
    from inference.parallel.config import ParallelConfig
    from inference.parallel.weights import rank_weight_bytes
    from inference.parallel.worker import rank_memory

    ranks = (
        eng.runner.memory()
        if hasattr(eng.runner, "memory")
        else [rank_memory(eng.runner.model, eng.runner.cache)]
    )

    spec = parse_config(cfg)
    _, state_seq = cache_bytes(spec)
    dtype = getattr(torch, args.dtype)
    shard = rank_params(spec, args.tp, args.ep) * dtype.itemsize  # the split rule, counted by analyze
    return {
        "ranks": ranks,
        "rank0_weight_bytes_from_meta_shard": rank_weight_bytes(
            spec, ParallelConfig(args.tp, args.ep, pipeline_parallel_size=args.pp), dtype
        ),
        "analyze_weight_bytes_per_rank": shard,
        # GPU 0 also holds the driver's vision tower and projector, whole (0 for a text model)
        "analyze_weight_bytes_gpu0": shard + driver_params(spec) * dtype.itemsize,
        "analyze_kv_bytes_per_token_per_gpu": _kv_per_gpu(spec, args.tp),
        "analyze_state_bytes_per_sequence_per_gpu": state_seq / args.tp,
        "note": "analyze counts bf16 KV and conv windows: equal to the ranks' per-token / per-slot "
        "figures in a bf16 run; the pools hold one extra block and slot when CUDA graphs are on",
    }


def plot(paths: list[str], out: Path) -> Path:
    """Decode tok/s (each batch) and prefill tok/s of each run, as grouped bars."""
    from PIL import Image, ImageDraw

    runs = [json.loads(Path(p).read_text()) for p in paths]
    metrics = [*sorted({k for r in runs for k in r.get("decode", {})}), "prefill"]

    def value(run: dict, m: str) -> float:
        if m == "prefill":
            return float(run.get("prefill", {}).get("tok_per_s", 0.0))
        return float(run.get("decode", {}).get(m, {}).get("tok_per_s", 0.0))

    w, h, left, top, bottom = 900, 480, 60, 40, 70
    img = Image.new("RGB", (w, h), "white")
    d = ImageDraw.Draw(img)
    d.text((left, 10), "dayzero parallel engine: tok/s per run (higher is better)", fill="black")
    colors = [(40, 90, 200), (200, 60, 40), (40, 160, 80), (150, 60, 170), (220, 150, 20), (90, 90, 90)]
    group = (w - left - 20) / max(len(metrics), 1)
    bar = group * 0.8 / max(len(runs), 1)
    for mi, m in enumerate(metrics):
        top_v = max(value(r, m) for r in runs) or 1.0
        x0 = left + mi * group
        d.text((x0, h - bottom + 25), m, fill="black")
        for ri, r in enumerate(runs):
            v = value(r, m)
            y = top + (h - top - bottom) * (1 - v / top_v)
            x = x0 + ri * bar
            d.rectangle([x, y, x + bar - 2, h - bottom], fill=colors[ri % len(colors)])
            d.text((x, y - 12), f"{v:.0f}", fill="black")
    d.line([left, h - bottom, w - 20, h - bottom], fill="black")
    for ri, r in enumerate(runs):
        a2a = "a2a " if r.get("expert_dispatch") == "all_to_all" else ""
        pp = f" pp{r['pp']}" if r.get("pp", 1) > 1 else ""
        d.text(
            (left + 150 * ri, h - 25),
            f"tp{r['tp']} ep{r['ep']}{pp} {a2a}({r['device']})",
            fill=colors[ri % len(colors)],
        )
    path = out / "parallel.png"
    img.save(path)
    return path


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    p.add_argument("--expert-dispatch", choices=["local", "all_to_all"], default="local")
    p.add_argument("--pp", type=int, default=1, help="pipeline stages")
    p.add_argument("--micro-batches", type=int, default=1, help="per step through the pipeline stages")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default=None, help="default bfloat16 on cuda, float32 on cpu")
    p.add_argument("--batches", default="32,128")
    p.add_argument("--prompt", type=int, default=128, help="prompt tokens of each decoding sequence")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps per batch")
    p.add_argument("--prefill", type=int, default=32768)
    p.add_argument("--chunk", type=int, default=16384, help="max_num_batched_tokens (prefill chunk)")
    p.add_argument("--num-blocks", type=int, default=4096)
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--sections", default="memory,decode,prefill,collectives,traffic,stages")
    p.add_argument("--quick", action="store_true", help="tiny model, small sizes (a CPU smoke run)")
    p.add_argument("--plot", nargs="*", help="only draw the chart of these result files")
    p.add_argument("--out", default=None)
    args = p.parse_args()
    out = Path(args.out) if args.out else None
    if args.plot:
        print(plot(args.plot, out or Path(".")))
        return
    if args.quick:
        args.batches, args.prompt, args.steps, args.prefill, args.chunk = "2,4", 16, 4, 256, 64
        args.num_blocks, args.profile_steps = 128, 2
    args.batches = [int(b) for b in args.batches.split(",")]
    args.dtype = args.dtype or ("bfloat16" if args.device == "cuda" else "float32")
    cfg = small_model_config() if args.quick else bench_config()
    results: dict[str, Any] = {
        "tp": args.tp, "ep": args.ep, "pp": args.pp, "micro_batches": args.micro_batches,
        "expert_dispatch": args.expert_dispatch, "device": args.device, "dtype": args.dtype,
    }  # fmt: skip
    if args.device == "cuda":
        results["gpu"] = torch.cuda.get_device_name()
        results["gpus"] = torch.cuda.device_count()
    a2a = "_a2a" if args.expert_dispatch == "all_to_all" else ""
    name = f"parallel_tp{args.tp}_ep{args.ep}{f'_pp{args.pp}' if args.pp > 1 else ''}{a2a}.json"

    def emit() -> None:
        text = json.dumps(results, indent=2)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / name).write_text(text)

    t0 = time.perf_counter()
    eng = make_engine(args, cfg)
    results["startup_s"] = round(time.perf_counter() - t0, 2)
    sections = args.sections.split(",")
    try:
        for section in sections:
            t0 = time.perf_counter()
            try:
                if section == "decode":
                    results["decode"] = {str(b): decode(eng, args, b) for b in args.batches}
                elif section == "prefill":
                    results["prefill"] = prefill(eng, args)
                elif section == "memory":
                    results["memory"] = memory(eng, cfg, args)
                elif section == "collectives":
                    results["collectives"] = collectives(eng, args, args.batches[0])
                elif section == "traffic":
                    results["traffic"] = traffic(eng, args, args.batches[0])
                elif section == "stages":
                    results["stages"] = {str(b): stages(eng, args, b) for b in args.batches}
            except Exception as exc:  # one failed section must not lose the others
                results[section] = {"error": repr(exc), "trace": traceback.format_exc()[-3000:]}
            results.setdefault("section_wall_s", {})[section] = round(time.perf_counter() - t0, 2)
            print(f"[{section}] {json.dumps(results.get(section))[:2000]}", flush=True)
            emit()
    finally:
        close = getattr(eng.runner, "close", None)
        if close is not None:
            close()
    print(json.dumps({k: v for k, v in results.items() if k not in ("collectives", "traffic")}, indent=1))


if __name__ == "__main__":
    main()

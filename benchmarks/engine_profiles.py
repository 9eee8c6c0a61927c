"""`benchmarks.engine`'s profiles (`--profile-ttft`, `--profile-decode`, `--profile-prefill`): where
the time of a cached agent turn, of an eager decode step and of one long prefill goes, by
torch.profiler."""

from __future__ import annotations

import json
import random
from typing import Any

from benchmarks.engine_setup import (
    cprofile_text,
    first_token,
    make_engine,
    rand_prompts,
    sync,
)
from benchmarks.engine_structured import STRUCTURED_SCHEMA, WideVocab, structured_decode  # noqa: F401
from inference.engine.request import SamplingParams


def profile_cached_turn(model, spec, dtype, device, context: int) -> dict[str, Any]:
    """Where the time of a cached agent turn goes: one turn under torch.profiler, top ops by time."""
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(5)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    eng = make_engine(model, spec, dtype, device, enable_prefix_caching=True)
    prompt = [rng.randrange(256) for _ in range(context)]
    first_token(eng, prompt, sp, device)
    prompt += [rng.randrange(256) for _ in range(64)]
    first_token(eng, prompt, sp, device)  # a first cached turn: captures its short-step graph
    nxt = prompt + [rng.randrange(256) for _ in range(64)]
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        ttft, _, hit = first_token(eng, nxt, sp, device)
    key = "self_cuda_time_total" if device.type == "cuda" else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=25)
    cpu_table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
    print(table, flush=True)
    print(cpu_table, flush=True)
    # the next turn under cProfile: which Python functions the host time goes to
    nxt += [rng.randrange(256) for _ in range(64)]
    host = cprofile_text(lambda: first_token(eng, nxt, sp, device), device)
    return {"ttft_ms": round(1000 * ttft, 2), "cached_tokens": hit, "table": table, "cpu_table": cpu_table,
            "host_profile": host}  # fmt: skip


def profile_decode(model, spec, dtype, device, batch: int = 32) -> dict[str, Any]:
    """GPU time of eager decode steps at `batch`: kernels per step, busy time, top kernels. With
    CUDA graphs the host launch cost is gone, so a graph step's time over this busy time says
    how much is left between kernels, and the table says which kernels the busy time goes to."""
    from torch.profiler import ProfilerActivity, profile

    eng = make_engine(model, spec, dtype, device, enable_cuda_graphs=False, num_state_slots=2 * batch + 8)
    for p in rand_prompts(batch, 128, 9):
        eng.add_request(p, SamplingParams(temperature=0, max_tokens=64, ignore_eos=True))
    while any(r.num_output_tokens == 0 for r in eng.scheduler.requests.values()):
        eng.step()
    for _ in range(3):
        eng.step()
    sync(device)
    steps = 5
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            eng.step()
        sync(device)
    ka = prof.key_averages()
    kernels = [e for e in ka if getattr(e, "device_time_total", 0) > 0 and e.device_type.name == "CUDA"]
    busy_us = sum(e.device_time_total for e in kernels) / steps
    launches = sum(e.count for e in kernels) / steps
    table = ka.table(sort_by="device_time_total", row_limit=30)
    print(table, flush=True)
    return {"batch": batch, "kernels_per_step": launches, "gpu_busy_ms_per_step": round(busy_us / 1000, 3),
            "table": table}  # fmt: skip


def profile_prefill(
    model, spec, dtype, device, n: int, chunks: tuple[int, ...] = (8192, 16384, 32768)
) -> dict[str, Any]:
    """Where one `n`-token prefill goes: its TTFT at each prefill chunk size (prefix cache off,
    after a warm-up prompt of the same shape), then the default chunk's run under torch.profiler:
    GPU busy time, kernels, the top kernels, and the gap between TTFT and kernel time (host work
    and launch latency between the chunks' kernels)."""
    from torch.profiler import ProfilerActivity, profile

    rng = random.Random(21)
    sp = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    blocks = (n + 512) // 64 + 1

    def engine(chunk: int):
        return make_engine(
            model, spec, dtype, device, max_model_len=n + 512, num_blocks=blocks + 64, num_state_slots=16,
            max_num_batched_tokens=chunk, checkpoint_interval=32768, max_num_seqs=8,
            enable_prefix_caching=False,
        )  # fmt: skip

    res: dict[str, Any] = {"tokens": n, "ttft_s_by_chunk": {}}
    for chunk in chunks:
        eng = engine(chunk)
        first_token(eng, [rng.randrange(256) for _ in range(n)], sp, device)  # compile + autotune
        ttft, _, _ = first_token(eng, [rng.randrange(256) for _ in range(n)], sp, device)
        res["ttft_s_by_chunk"][str(chunk)] = round(ttft, 4)
        print(f"[profile_prefill] {n} tokens, chunk {chunk}: {ttft:.4f} s", flush=True)
        del eng
    chunk = 16384
    eng = engine(chunk)
    first_token(eng, [rng.randrange(256) for _ in range(n)], sp, device)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=acts) as prof:
        ttft, _, _ = first_token(eng, [rng.randrange(256) for _ in range(n)], sp, device)
    ka = prof.key_averages()
    kernels = [e for e in ka if getattr(e, "device_time_total", 0) > 0 and e.device_type.name == "CUDA"]
    busy_ms = sum(e.device_time_total for e in kernels) / 1000
    top = sorted(kernels, key=lambda e: -e.device_time_total)[:25]
    res["profiled"] = {
        "chunk": chunk, "ttft_s": round(ttft, 4), "gpu_busy_ms": round(busy_ms, 2),
        "kernels": int(sum(e.count for e in kernels)),
        "top": [{"name": e.key[:110], "calls": e.count, "ms": round(e.device_time_total / 1000, 3)} for e in top],
    }  # fmt: skip
    ops = sorted((e for e in ka if e.device_type.name == "CPU"), key=lambda e: -e.device_time_total)[:25]
    res["profiled"]["top_ops"] = [
        {"op": e.key[:80], "calls": e.count, "gpu_ms": round(e.device_time_total / 1000, 3),
         "cpu_ms": round(e.cpu_time_total / 1000, 3)} for e in ops
    ]  # fmt: skip
    print(json.dumps(res["profiled"], indent=1), flush=True)
    return res

"""`benchmarks.engine`'s profiles (`--profile-ttft`, `--profile-decode`): where the time of a cached
agent turn and of an eager decode step goes, by torch.profiler."""

from __future__ import annotations

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

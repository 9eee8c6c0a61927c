"""The memory planner: measures the device and a profiled peak step, and sizes the engine's pools.

`plan_pools` is the one planning rule of every engine (the single-GPU factory and each parallel
rank): on CUDA it profiles the largest step a sequence can take (`longest_step`, run by a
throw-away engine) and hands the byte counts to `memory_plan.plan_memory`, the arithmetic that
decides; elsewhere the configured pools are the plan.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from inference.cache.tiers import TierConfig
from inference.engine.engine import Engine, EngineConfig
from inference.engine.memory_plan import MemoryPlan, check_pools, plan_memory
from inference.engine.request import SamplingParams

__all__ = ["longest_step", "plan_pools"]

log = logging.getLogger(__name__)


def longest_step(engine: Engine, n: int, context: int) -> None:
    """Run the largest step a sequence of `context` tokens can take: one prefill chunk of `n`
    tokens ending at its last prompt position (`context - 1`), attending to every earlier one.
    The KV before the chunk is whatever the pool holds (its values do not change the memory the
    step takes: the attention workspace grows with the keys, not with what they hold); the
    engine's pool must cover `context` tokens from block 0."""
    from inference.engine.request import Request
    from inference.engine.scheduler import ScheduledRequest, SchedulerOutput

    B = engine.config.cache.block_size
    start = max(context - 1 - n, 0)
    end = start + n
    rid = "memory-plan-profile"
    req = Request(rid, [0] * end, SamplingParams(temperature=0.0, max_tokens=1))
    step = ScheduledRequest(
        rid, tuple([0] * n), start, tuple(range(-(-end // B))), slot=0, is_new=True, sample=True
    )
    try:
        engine.runner.execute(SchedulerOutput(scheduled=[step], state_zeros=[0]), {rid: req})
    finally:
        engine.runner.drop(rid)


def _profile_activations(
    model: Any, tokenizer: Any, cache_spec: Any, config: EngineConfig, device, dtype
) -> int:
    """Peak memory growth of the largest step: one sequence's prefill chunk of
    `max_num_batched_tokens` tokens, both at the start of a sequence and at the end of one of
    `max_model_len` tokens (where the attention workspace over all earlier keys is largest: a
    1M-token request must not run out of memory in its last chunk), run by a throw-away engine
    whose pools just hold one such sequence (the pools themselves are not counted)."""
    L = config.scheduler.max_model_len
    n = max(1, min(config.scheduler.max_num_batched_tokens, L - 1))
    probe_config = config.evolve(
        num_blocks=-(-L // config.cache.block_size) + 1,
        num_state_slots=2,
        max_model_len=L,
        enable_cuda_graphs=False,
        enable_prefix_caching=False,
        tiers=TierConfig(),
    )
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    before = torch.cuda.memory_allocated(device)
    probe = Engine(model, tokenizer, probe_config, cache_spec=cache_spec, device=device, dtype=dtype)
    pools = torch.cuda.memory_allocated(device) - before
    peaks = []
    for context in dict.fromkeys((n + 1, L)):  # the first chunk, then the last one of max_model_len
        torch.cuda.reset_peak_memory_stats(device)
        longest_step(probe, n, context)
        torch.cuda.synchronize(device)
        peaks.append(torch.cuda.max_memory_allocated(device) - before - pools)
    log.info("profiled step peaks (first chunk, last chunk at %d tokens): %s bytes", L, peaks)
    del probe
    torch.cuda.empty_cache()
    return max(max(peaks), 0)


def plan_pools(
    model: Any,
    tokenizer: Any,
    cache_spec: Any,
    config: EngineConfig,
    device: torch.device,
    dtype: torch.dtype,
    *,
    mem_fraction: float,
    fixed_blocks: bool,
) -> tuple[EngineConfig, MemoryPlan]:
    """On CUDA, size the KV pool from what the weights and a profiled peak forward leave of
    `mem_fraction` of the device (the rest is headroom); `fixed_blocks` keeps `num_blocks` and
    checks that it fits. Elsewhere the configured pools are the plan. Either way a sequence of
    `max_model_len` must fit, or this raises `MemoryPlanError` naming the numbers."""
    cc, max_len = config.cache, config.scheduler.max_model_len
    per_block = cache_spec.kv_bytes_per_token * cc.block_size
    if device.type != "cuda":
        plan = MemoryPlan(
            cc.block_size, cc.num_blocks, cc.num_state_slots, per_block, cache_spec.state_bytes_per_slot
        )
        return config, check_pools(plan, max_len)
    activations = _profile_activations(model, tokenizer, cache_spec, config, device, dtype)
    free, total = torch.cuda.mem_get_info(device)
    plan = plan_memory(
        device_total=total,
        in_use=total - free,
        activations=activations,
        block_size=cc.block_size,
        kv_bytes_per_block=per_block,
        state_bytes_per_slot=cache_spec.state_bytes_per_slot,
        num_state_slots=cc.num_state_slots,
        max_model_len=max_len,
        headroom_fraction=1.0 - mem_fraction,
        num_blocks=cc.num_blocks if fixed_blocks else None,
    )
    return config.evolve(num_blocks=plan.num_blocks), plan

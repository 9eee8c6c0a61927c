"""What `dayzero analyze` tells a user beyond the figures: warnings about the request (a context
past the length the checkpoint was trained for, and the YaRN factor that would reach it) and, for
a plan that does not fit, the smallest change along each axis that makes one fit (weight
precision, more GPUs, a shorter context, offload tiers for the conversations that cannot run at
once). Every "fits" here is `plan.fewest_gpus_plans`' verdict, the one the plan itself uses.
"""

from __future__ import annotations

import math

from inference.analyze.params import cache_bytes
from inference.analyze.plan import (
    HEADROOM,
    MAX_GPUS,
    WEIGHT_BYTES,
    GiB,
    ParallelPlan,
    fewest_gpus_plans,
    plan_parallel,
)
from inference.config import GQA, MLA, ModelSpec

__all__ = ["context_warnings", "fit_suggestions"]

MAX_SUGGESTED_GPUS = 4096  # how far "more GPUs" looks past the limit given


def _uses_rotary(s: ModelSpec) -> bool:
    """Whether any layer rotates by position (KDA and gated DeltaNet carry order in their state;
    Kimi-Linear's MLA is NoPE)."""
    mla_rope = s.mla is not None and s.mla.use_rope and MLA in s.layer_kinds
    return mla_rope or GQA in s.layer_kinds


def context_warnings(s: ModelSpec, context: int) -> list[str]:
    """A warning when `context` exceeds the config's `max_position_embeddings`, with the YaRN
    factor that would cover it (or why none applies)."""
    trained = s.max_position_embeddings
    if trained is None or context <= trained:
        return []
    head = f"--context {context:,} exceeds max_position_embeddings {trained:,}, the longest context the checkpoint was trained for"
    if not _uses_rotary(s):
        return [f"{head}; its attention uses no rotary positions (NoPE), so no rope scaling applies: quality past {trained:,} tokens is untested"]  # fmt: skip
    scaling = dict(s.mla.rope_scaling) if s.mla is not None and s.mla.rope_scaling else {}
    kind = scaling.get("type", scaling.get("rope_type"))
    if kind == "yarn":
        original, factor = int(scaling["original_max_position_embeddings"]), float(scaling["factor"])  # type: ignore[arg-type]
        need = math.ceil(context / original)
        return [
            f"{head} (YaRN x{factor:g} over {original:,} original positions); covering {context:,} tokens takes "
            f"rope_scaling.factor >= {need} ({context:,} / {original:,}), a scaling the model was not trained with: "
            f"expect quality to drop past {trained:,} tokens"
        ]  # fmt: skip
    need = math.ceil(context / trained)
    yarn = f'{{"type": "yarn", "factor": {need}, "original_max_position_embeddings": {trained}}}'
    if s.model_type == "qwen3_next":  # its reader refuses rope scaling (inference/config/qwen3_next.py)
        return [f"{head}; a YaRN factor of {need} over {trained:,} positions would cover it, but this runtime serves no rope scaling for qwen3_next"]  # fmt: skip
    return [f"{head}; rope_scaling = {yarn} would cover it, a scaling the model was not trained with"]


def _fits(
    s: ModelSpec, limit: int, gpu_mem_gib: float, context: int, dtype: str, sequences: int
) -> ParallelPlan | None:
    plans = fewest_gpus_plans(s, limit, gpu_mem_gib, context, dtype, sequences)
    return plans[0] if plans and plans[0].fits else None


def _where(p: ParallelPlan) -> str:
    return f"{p.gpus} GPU(s) TP={p.tp} EP={p.ep} PP={p.pp}, up to {p.max_sequences} sequence(s)"


def fit_suggestions(
    s: ModelSpec,
    *,
    gpus: int | None,
    gpu_mem_gib: float,
    context: int,
    weight_dtype: str,
    sequences: int,
    plan: ParallelPlan | None,
) -> list[str]:
    """For a request no plan fits: the smallest change along each axis that fits (empty if a plan fits)."""
    if plan is not None and plan.fits:
        return []
    limit = gpus or MAX_GPUS
    out: list[str] = []
    smaller = [d for d in sorted(WEIGHT_BYTES, key=WEIGHT_BYTES.__getitem__, reverse=True)
               if WEIGHT_BYTES[d] < WEIGHT_BYTES[weight_dtype]]  # fmt: skip
    for dtype in smaller:
        if (p := _fits(s, limit, gpu_mem_gib, context, dtype, sequences)) is not None:
            out.append(
                f"--weights {dtype}: fits on {_where(p)} (with a runtime that keeps {dtype} weights; "
                "`dayzero infer serve` dequantizes checkpoints to bf16 at load)"
            )
            break
    for n in (2**i for i in range(13)):
        if limit < n <= MAX_SUGGESTED_GPUS:
            found = plan_parallel(s, n, gpu_mem_gib, context, weight_dtype, sequences)
            if found and found[0].fits:
                out.append(f"--gpus {n}: fits on {_where(found[0])} ({weight_dtype} weights)")
                break
    if _fits(s, limit, gpu_mem_gib, 1, weight_dtype, 1) is None:  # not even one token
        out.append(
            f"no shorter context fits: the {weight_dtype} weights alone exceed {limit} GPU(s) of "
            f"{gpu_mem_gib:g} GiB (with {HEADROOM:.0%} headroom)"
        )
        out.append(
            "offload tiers hold KV blocks and state checkpoints, not weights: they cannot make this fit"
        )
        return out
    if _fits(s, limit, gpu_mem_gib, 1, weight_dtype, sequences) is None:
        out.append(f"no shorter context fits {sequences} sequences at once on {limit} GPU(s)")
    else:
        lo, hi = 1, context  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _fits(s, limit, gpu_mem_gib, mid, weight_dtype, sequences) else (lo, mid)
        longest = lo // 1024 * 1024 if lo >= 1024 else lo
        p = _fits(s, limit, gpu_mem_gib, longest, weight_dtype, sequences)
        where = f" ({_where(p)}, {weight_dtype} weights)" if p is not None else ""
        out.append(f"--context {longest:,}: the longest that fits{where}")
    out.append(_offload(s, limit, gpu_mem_gib, context, weight_dtype, sequences))
    return out


def _offload(s: ModelSpec, limit: int, gpu_mem_gib: float, context: int, dtype: str, sequences: int) -> str:
    """Host/disk tiers keep idle conversations' caches (KV blocks and state checkpoints) and bring
    them back when they resume; a running sequence's cache must be on the GPUs."""
    running = 0
    if sequences > 1:
        lo, hi = 0, sequences  # the most sequences that run at once
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if _fits(s, limit, gpu_mem_gib, context, dtype, mid) else (lo, mid)
        running = lo
    if running == 0:
        return (
            "offload tiers (`dayzero infer serve --kv-offload-host-gb`) do not make this fit: they keep idle "
            "conversations' caches, and a running sequence's KV and state must be on the GPUs"
        )
    kv_tok, state_seq = cache_bytes(s)
    idle = (sequences - running) * (kv_tok * context + state_seq)
    return (
        f"--sequences {running} run at once; `dayzero infer serve --kv-offload-host-gb "
        f"{math.ceil(idle / GiB)}` (or --kv-offload-disk-gb) keeps the other {sequences - running} "
        "conversations' caches while they are idle and brings them back when they resume"
    )

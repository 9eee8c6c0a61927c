"""TP/EP/PP plans with 20% headroom per GPU, preferring the fewest GPUs that hold the model."""

from __future__ import annotations

import math
from dataclasses import dataclass

from inference.analyze.params import KV_DTYPE_BYTES, cache_bytes, kv_per_layer, parameter_counts
from inference.config import GDN, GQA, KDA, MLA, ModelSpec

__all__ = ["HEADROOM", "WEIGHT_BYTES", "ParallelPlan", "gpu_counts", "plan_parallel"]

GiB = 1024**3
HEADROOM = 0.20  # fraction of each GPU kept free (activations, fragmentation, CUDA context)
# bytes per weight; int4 counts its group scales (one bf16 scale per 32 weights, the K2.5 layout)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 32, "fp4": 0.5}


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """One replica over `tp * pp` GPUs; routed experts split `ep` ways over the TP group (ep == tp)."""

    gpus: int
    tp: int
    ep: int
    pp: int
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float
    state_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    fits: bool
    max_sequences: int
    note: str = ""


def _split_problem(s: ModelSpec, tp: int) -> str:
    """Why TP=`tp` does not split this model evenly ("" when it does)."""
    heads = []
    if s.kda is not None and KDA in s.layer_kinds:
        heads.append(("KDA heads", s.kda.num_heads))
    if s.mla is not None and MLA in s.layer_kinds:
        heads.append(("MLA heads", s.mla.num_heads))
    if s.gdn is not None and GDN in s.layer_kinds:
        heads += [("GDN key heads", s.gdn.num_k_heads), ("GDN value heads", s.gdn.num_v_heads)]
    if s.gqa is not None and GQA in s.layer_kinds:
        heads.append(("GQA heads", s.gqa.num_heads))
        kv = s.gqa.num_kv_heads
        if kv % tp and tp % kv:  # fewer kv heads than ranks is fine: each rank keeps a replica
            return f"GQA kv heads {kv} vs TP {tp}"
    if s.moe is not None:
        heads.append(("experts", s.moe.num_experts))
    for what, n in heads:
        if n % tp:
            return f"{what} {n} not divisible by TP {tp}"
    return ""


def _kv_per_gpu(s: ModelSpec, tp: int) -> int:
    """KV bytes per token on one rank: the MLA latent and indexer keys are shared by all heads, so
    every TP rank keeps them whole; GQA K/V split by kv head (replicated past num_kv_heads)."""
    total = 0
    for kind in s.layer_kinds:
        per = kv_per_layer(s, kind, KV_DTYPE_BYTES)
        total += per / min(tp, s.gqa.num_kv_heads) if kind == GQA else per
    return math.ceil(total)


def plan_parallel(
    s: ModelSpec, gpus: int, gpu_mem_gib: float, context: int, weight_dtype: str = "bf16", sequences: int = 1
) -> list[ParallelPlan]:
    """Every (tp, pp) with tp * pp == gpus that splits cleanly, best first (fits, fewer stages, room).

    TP splits attention heads and FFN columns, EP (== tp) splits routed experts, PP splits layers.
    Weights are taken as evenly split (replicated norms and routers are < 0.1% of a large model).
    """
    head, _ = parameter_counts(s)
    wb = WEIGHT_BYTES[weight_dtype]
    _, state_seq = cache_bytes(s)
    usable = gpu_mem_gib * GiB * (1 - HEADROOM)
    plans = []
    for tp in (t for t in range(1, gpus + 1) if gpus % t == 0):
        pp = gpus // tp
        if pp > s.num_layers or _split_problem(s, tp):
            continue
        w = head["total"] * wb / (tp * pp)
        kv = _kv_per_gpu(s, tp) * context / pp
        st = state_seq / (tp * pp)
        per_seq = kv + st
        free = usable - w
        n = max(0, math.floor(free / per_seq)) if per_seq else (sequences if free > 0 else 0)
        plans.append(
            ParallelPlan(
                gpus=gpus, tp=tp, ep=tp, pp=pp, weight_bytes_per_gpu=w, kv_bytes_per_gpu=kv * sequences,
                state_bytes_per_gpu=st * sequences, usable_bytes_per_gpu=usable, fits=n >= sequences,
                max_sequences=n, note="" if n >= sequences else "does not fit",
            )
        )  # fmt: skip
    return sorted(plans, key=lambda p: (not p.fits, p.pp, -p.max_sequences))


def gpu_counts(limit: int) -> list[int]:
    """Candidate replica sizes up to `limit`: powers of two, and `limit` itself."""
    counts = [n for n in (2**i for i in range(12)) if n <= limit]
    return counts + ([limit] if limit not in counts else [])

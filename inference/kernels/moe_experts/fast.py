"""Routed experts as grouped GEMMs: the sync-free fast path of the family (`reference.py`: the loop).

The grouped path sorts the `T * k` (token, expert) pairs by expert and
runs two grouped GEMMs over stacked weights with device-side group offsets: no host sync, fixed
shapes for a fixed `T`, and a deterministic combine (no atomics).
"""

from __future__ import annotations

import torch
from torch import Tensor

from inference.kernels.moe_dispatch import combine, silu_mul, sort_pairs
from inference.kernels.moe_gemm import moe_down, moe_gemm_fast_applies, moe_up

__all__ = ["moe_experts_grouped"]


def moe_experts_grouped(
    x: Tensor, weights: Tensor, ids: Tensor, w13: Tensor, w2: Tensor, shared: Tensor | None = None
) -> Tensor:
    """Grouped-GEMM routed experts, free of host syncs.

    Args:
        x: `[T, H]` tokens.
        weights: `[T, k]` fp32 routing weights; ids: `[T, k]` int64 expert ids.
        w13: `[E, 2I, H]` stacked gate (rows `:I`) and up (rows `I:`) weights.
        w2: `[E, H, I]` stacked down weights.
        shared: optional `[T, H]` dense term added to the result (the shared experts' output),
            fused into the combine.
    Returns:
        `[T, H]` in `x.dtype`.

    The bookkeeping around the two GEMMs (stable sort of the (token, slot) pairs by expert with
    device-side group ends, SwiGLU, the fixed-order weighted sum over the k slots: no atomics) is
    `inference/kernels/moe_dispatch`: one Triton kernel each at decode sizes on CUDA. At decode
    sizes the GEMMs are `inference/kernels/moe_gemm` too (the gather of the token rows and SwiGLU
    fused in); above them (prefill) cutlass's `torch._grouped_mm`.
    """
    order, tok, place, offsets = sort_pairs(ids, w13.shape[0])
    del order  # the GEMMs need only each sorted pair's token row and the group ends
    if moe_gemm_fast_applies(x, tok.shape[0]):
        y = moe_down(moe_up(x, tok, w13, offsets), w2, offsets)
    else:
        xs = x.index_select(0, tok)
        h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offsets)  # [T*k, 2I]
        y = torch._grouped_mm(silu_mul(h), w2.transpose(1, 2), offs=offsets)  # [T*k, H]
    return combine(y, place, weights, shared)

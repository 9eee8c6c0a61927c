"""Routed-expert compute: a per-expert reference loop and a sync-free grouped-GEMM fast path.

Both take the router's choice (`weights [T, k]`, `ids [T, k]`) and return the weighted sum of the
chosen experts' SwiGLU outputs `[T, hidden]`. The reference runs one small MLP per expert that got
tokens; it reads the per-expert counts on the host, which stalls the GPU once per layer and cannot
be captured in a CUDA graph. The grouped path sorts the `T * k` (token, expert) pairs by expert and
runs two grouped GEMMs over stacked weights with device-side group offsets: no host sync, fixed
shapes for a fixed `T`, and a deterministic combine (no atomics).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from inference.kernels.moe_dispatch import combine, silu_mul, sort_pairs
from inference.kernels.moe_gemm import moe_down, moe_gemm_fast_applies, moe_up

__all__ = ["grouped_mm_available", "moe_experts_grouped", "moe_experts_reference"]


def moe_experts_reference(
    x: Tensor, weights: Tensor, ids: Tensor, w1: list[Tensor], w2: list[Tensor], w3: list[Tensor]
) -> Tensor:
    """Per-expert loop (exact reference).

    Args:
        x: `[T, H]` tokens.
        weights: `[T, k]` fp32 routing weights (already scaled); ids: `[T, k]` int64 expert ids.
        w1, w3: per-expert `[I, H]` gate and up weights; w2: per-expert `[H, I]` down weights.
    Returns:
        `[T, H]` in `x.dtype`.
    """
    out = torch.zeros_like(x)
    top_k = ids.shape[1]
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=len(w1)).tolist()
    token_of = order // top_k
    w_of = weights.flatten()[order]
    start = 0
    for e, n in enumerate(counts):
        if n == 0:
            continue
        tok = token_of[start : start + n]
        xe = x[tok]
        y = F.linear(F.silu(F.linear(xe, w1[e])) * F.linear(xe, w3[e]), w2[e])
        out.index_add_(0, tok, (y * w_of[start : start + n, None]).to(out.dtype))
        start += n
    return out


def grouped_mm_available() -> bool:
    """Whether this torch has the grouped GEMM (`torch._grouped_mm`, torch >= 2.8)."""
    return hasattr(torch, "_grouped_mm")


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

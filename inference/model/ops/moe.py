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


def moe_experts_grouped(x: Tensor, weights: Tensor, ids: Tensor, w13: Tensor, w2: Tensor) -> Tensor:
    """Grouped-GEMM routed experts, free of host syncs.

    Args:
        x: `[T, H]` tokens.
        weights: `[T, k]` fp32 routing weights; ids: `[T, k]` int64 expert ids.
        w13: `[E, 2I, H]` stacked gate (rows `:I`) and up (rows `I:`) weights.
        w2: `[E, H, I]` stacked down weights.
    Returns:
        `[T, H]` in `x.dtype`.
    """
    t, top_k = ids.shape
    num_experts, two_i, _ = w13.shape
    flat = ids.flatten()
    order = flat.argsort(stable=True)  # (token, slot) pairs grouped by expert
    # group ends from the sorted ids (bincount would size its output on the host: a sync)
    ends = torch.arange(1, num_experts + 1, device=ids.device, dtype=flat.dtype)
    offsets = torch.searchsorted(flat[order], ends).to(torch.int32)
    xs = x.index_select(0, order // top_k)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=offsets)  # [T*k, 2I]
    a = F.silu(h[:, : two_i // 2]) * h[:, two_i // 2 :]
    y = torch._grouped_mm(a, w2.transpose(1, 2), offs=offsets)  # [T*k, H]
    # back to (token, slot) order, then a fixed-order weighted sum over the k slots
    unsorted = torch.empty_like(y).index_copy_(0, order, y)
    return (unsorted.view(t, top_k, -1).float() * weights[..., None]).sum(1).to(x.dtype)

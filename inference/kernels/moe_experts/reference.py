"""Routed experts, the reference: one small SwiGLU MLP per expert that got tokens.

It reads the per-expert counts on the host, which stalls the GPU once per layer and cannot be
captured in a CUDA graph (the grouped path, `fast.py`, does neither).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["moe_experts_reference"]


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

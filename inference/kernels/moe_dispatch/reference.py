"""PyTorch references of the grouped-GEMM MoE's bookkeeping around its two GEMMs.

`sort_pairs`: the `T * k` (token, slot) pairs ordered by expert (stable: ties keep pair order),
with each sorted pair's token row, each pair's place in that order, and the per-expert group ends
the grouped GEMM takes. `combine`: the fixed-order weighted sum over each token's k slots of the
expert outputs (fp32, cast to the activation dtype), plus an optional dense term (the shared
experts) added in the activation dtype, exactly as the eager `routed + shared`.
`silu_mul`: the SwiGLU activation of a `[T, 2I]` gate|up GEMM output, rounded as eager
`F.silu(gate) * up` is.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["combine_reference", "silu_mul_reference", "sort_pairs_reference"]


def sort_pairs_reference(ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """ids `[T, k]` -> (order `[T*k]` int64, token of each sorted pair `[T*k]` int64,
    place of each pair in the order `[T*k]` int64, group ends `[E]` int32)."""
    top_k = ids.shape[1]
    flat = ids.flatten()
    order = flat.argsort(stable=True)
    ends = torch.arange(1, num_experts + 1, device=ids.device, dtype=flat.dtype)
    offsets = torch.searchsorted(flat[order], ends).to(torch.int32)
    place = torch.empty_like(order).index_copy_(0, order, torch.arange(order.numel(), device=ids.device))
    return order, order // top_k, place, offsets


def combine_reference(y: Tensor, place: Tensor, weights: Tensor, shared: Tensor | None = None) -> Tensor:
    """y `[T*k, H]` expert outputs in sorted order, place `[T*k]`, weights `[T, k]` fp32,
    shared `[T, H]` or None -> `[T, H]` in `y.dtype`."""
    t, top_k = weights.shape
    unsorted = y.index_select(0, place)
    out = (unsorted.view(t, top_k, -1).float() * weights[..., None]).sum(1).to(y.dtype)
    return out if shared is None else out + shared


def silu_mul_reference(h: Tensor) -> Tensor:
    """h `[T, 2I]` (gate | up) -> `silu(gate) * up` `[T, I]` in `h.dtype`."""
    gate, up = h.chunk(2, dim=-1)
    return F.silu(gate) * up

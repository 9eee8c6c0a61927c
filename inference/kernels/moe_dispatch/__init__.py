"""The grouped-GEMM MoE's bookkeeping: pair sort, combine, SwiGLU (`use_fast`: Triton on CUDA)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.moe_dispatch.reference import (
    combine_reference,
    silu_mul_reference,
    sort_pairs_reference,
)

__all__ = ["combine", "silu_mul", "sort_pairs"]


def sort_pairs(ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(order, token of each sorted pair, place of each pair, group ends); see `reference.py`."""
    if use_fast(ids):
        from inference.kernels.moe_dispatch.fast import MAX_PAIRS, sort_pairs_fast

        if ids.numel() <= MAX_PAIRS:
            return sort_pairs_fast(ids, num_experts)
    return sort_pairs_reference(ids, num_experts)


def combine(y: Tensor, place: Tensor, weights: Tensor, shared: Tensor | None = None) -> Tensor:
    """Weighted sum of each token's k expert outputs (+ `shared`); see `reference.py`."""
    if use_fast(y):
        from inference.kernels.moe_dispatch.fast import combine_fast

        return combine_fast(y, place, weights, shared)
    return combine_reference(y, place, weights, shared)


def silu_mul(h: Tensor) -> Tensor:
    """`silu(gate) * up` of a `[T, 2I]` gate|up output; see `reference.py`."""
    if use_fast(h) and h.dim() == 2 and h.stride(-1) == 1:
        from inference.kernels.moe_dispatch.fast import silu_mul_fast

        return silu_mul_fast(h)
    return silu_mul_reference(h)

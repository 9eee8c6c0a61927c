"""Sigmoid top-k MoE routing (`use_fast`: Triton on CUDA, the reference elsewhere)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.moe_router.reference import sigmoid_topk_route_reference

__all__ = ["sigmoid_topk_route", "sigmoid_topk_route_reference"]


def sigmoid_topk_route(
    x: Tensor, weight: Tensor, bias: Tensor, top_k: int, renormalize: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """(weights `[T, k]` fp32, expert ids `[T, k]` int64); contract in `reference.py`."""
    if use_fast(x):
        from inference.kernels.moe_router.fast import sigmoid_topk_route_fast

        return sigmoid_topk_route_fast(x, weight, bias, top_k, renormalize, scale)
    return sigmoid_topk_route_reference(x, weight, bias, top_k, renormalize, scale)

"""Decode norms: RMSNorm, RMSNorm fused with the residual add, KDA's gated output RMSNorm.

`use_fast` picks the Triton kernel (CUDA tensors) or the PyTorch reference (CPU), per call.
"""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.rmsnorm.reference import (
    add_rms_norm_reference,
    gated_rms_norm_reference,
    rms_norm_reference,
)

__all__ = ["add_rms_norm", "gated_rms_norm", "rms_norm"]


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`weight * rmsnorm_fp32(x).to(x.dtype)` (see `reference.py`)."""
    if use_fast(x):
        from inference.kernels.rmsnorm.fast import rms_norm_fast

        return rms_norm_fast(x, weight, eps)
    return rms_norm_reference(x, weight, eps)


def add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`(rms_norm(residual + x), residual + x)` (see `reference.py`)."""
    if use_fast(x) and x.dtype == residual.dtype:
        from inference.kernels.rmsnorm.fast import add_rms_norm_fast

        return add_rms_norm_fast(x, residual, weight, eps)
    return add_rms_norm_reference(x, residual, weight, eps)


def gated_rms_norm(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`rmsnorm(x) * weight * sigmoid(gate)` in fp32, returned in `x.dtype` (see `reference.py`)."""
    if use_fast(x):
        from inference.kernels.rmsnorm.fast import gated_rms_norm_fast

        return gated_rms_norm_fast(x, gate, weight, eps)
    return gated_rms_norm_reference(x, gate, weight, eps)

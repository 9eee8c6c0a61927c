"""PyTorch references of the decode norms (the Triton kernels' oracles and the CPU path).

The exact eager semantics the model layers had before the kernels (HF's): the residual sum is
rounded to the activation dtype, the norm runs in fp32, and the plain norm casts back to the
activation dtype *before* multiplying by its weight (so the product is rounded in the promoted
dtype of weight and activations).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["add_rms_norm_reference", "gated_rms_norm_reference", "rms_norm_reference"]


def rms_norm_reference(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`weight * rmsnorm_fp32(x).to(x.dtype)` over the last dim; `[..., D]` -> `[..., D]`."""
    xf = F.rms_norm(x.float(), (x.shape[-1],), eps=eps)
    return weight * xf.to(x.dtype)


def add_rms_norm_reference(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`s = residual + x` (in the activation dtype), then `(rms_norm(s), s)`."""
    s = residual + x
    return rms_norm_reference(s, weight, eps), s


def gated_rms_norm_reference(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """KDA output norm: `rmsnorm(x) * weight * sigmoid(gate)` in fp32, returned in `x.dtype`."""
    xf = F.rms_norm(x.float(), (x.shape[-1],), weight.float(), eps=eps)
    return (xf * torch.sigmoid(gate.float())).to(x.dtype)

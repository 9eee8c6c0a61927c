"""Small shared layers: RMS norms and rotary embeddings."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from inference.kernels.rmsnorm import add_rms_norm, gated_rms_norm, rms_norm

__all__ = ["GatedRMSNorm", "RMSNorm", "rope_cos_sin", "rope_half_split", "rope_interleaved"]


class RMSNorm(nn.Module):
    """`weight * (x / rms(x))`, normalised in fp32 and cast back before the weight (HF semantics).

    On CUDA one Triton kernel (`inference/kernels/rmsnorm`), elsewhere the PyTorch reference."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        """x: `[..., dim]` -> same shape and dtype."""
        return rms_norm(x, self.weight, self.eps)

    def add(self, x: Tensor, residual: Tensor) -> tuple[Tensor, Tensor]:
        """`(norm(residual + x), residual + x)`: the residual add fused into the norm's kernel."""
        return add_rms_norm(x, residual, self.weight, self.eps)


class GatedRMSNorm(nn.Module):
    """KDA output norm: `rmsnorm(x) * weight * sigmoid(gate)`, all in fp32."""

    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor, gate: Tensor) -> Tensor:
        """x, gate: `[..., dim]` -> `[..., dim]` in `x.dtype` (one Triton kernel on CUDA)."""
        return gated_rms_norm(x, gate, self.weight, self.eps)


def rope_cos_sin(positions: Tensor, dim: int, theta: float) -> tuple[Tensor, Tensor]:
    """Angles for `dim` rotary channels: `(cos, sin)` each `[T, dim // 2]` fp32."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, dim, 2, device=positions.device, dtype=torch.float32) / dim))
    freqs = positions.float()[:, None] * inv_freq[None, :]
    return freqs.cos(), freqs.sin()


def rope_interleaved(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """DeepSeek MLA rope: pairs `(x0, x1), (x2, x3) ...` rotated, output de-interleaved.

    x: `[T, ..., P]`; cos/sin: `[T, P // 2]`. Returns `[T, ..., P]` laid out as
    `[rotated evens | rotated odds]` (q and k both get it, so dot products are unchanged).
    """
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    c, s = cos.view(shape), sin.view(shape)
    x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)


def rope_half_split(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Llama-style rope on halves: `x * cos + rotate_half(x) * sin`. Shapes as `rope_interleaved`."""
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (cos.shape[-1],)
    c, s = cos.view(shape), sin.view(shape)
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1).to(x.dtype)

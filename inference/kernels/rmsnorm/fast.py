"""Triton decode norms: one program per row, the whole row in registers (D <= 16K).

Each replaces a chain of 4-6 eager kernels (fp32 casts, the norm, the cast back, the weight
product, the residual add or the sigmoid gate), which at decode batch sizes are all launch-bound.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["add_rms_norm_fast", "gated_rms_norm_fast", "rms_norm_fast"]

MAX_DIM = 16384  # a row lives in one program's registers


@triton.jit
def _rms_norm_kernel(
    X, R, W, Y, S, stride_x, stride_r, stride_y, stride_s, D, eps,
    HAS_RES: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    x = tl.load(X + row * stride_x + cols, mask=mask, other=0.0)
    if HAS_RES:
        r = tl.load(R + row * stride_r + cols, mask=mask, other=0.0)
        # rounded to the activation dtype, as the eager `residual + x` is
        x = (x.to(tl.float32) + r.to(tl.float32)).to(X.dtype.element_ty)
        tl.store(S + row * stride_s + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    n = (xf * rstd).to(X.dtype.element_ty)  # cast back before the weight (HF semantics)
    w = tl.load(W + cols, mask=mask, other=0.0)
    y = n.to(tl.float32) * w.to(tl.float32)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


@triton.jit
def _gated_rms_norm_kernel(X, G, W, Y, stride_x, stride_g, stride_y, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < D
    xf = tl.load(X + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + row * stride_g + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(W + cols, mask=mask, other=0.0).to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / D + eps)
    y = xf * rstd * w * tl.sigmoid(g)
    tl.store(Y + row * stride_y + cols, y.to(Y.dtype.element_ty), mask=mask)


def _rows(x: Tensor) -> Tensor:
    """`x` as a 2-D `[rows, D]` view with unit stride in D (a copy only when it has none)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _block(d: int) -> int:
    if d > MAX_DIM:
        raise ValueError(f"the Triton norms keep a row in registers: D must be <= {MAX_DIM}, got {d}")
    return triton.next_power_of_2(d)


def _warps(block: int) -> int:
    return 4 if block <= 2048 else 8


def rms_norm_fast(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`rms_norm_reference`'s contract in one kernel."""
    d = x.shape[-1]
    x2 = _rows(x)
    y = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    if x2.shape[0]:
        blk = _block(d)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, x2, weight, y, y, x2.stride(0), 0, y.stride(0), 0, d, eps,
            HAS_RES=False, BLOCK=blk, num_warps=_warps(blk),
        )  # fmt: skip
    return y.view(x.shape)


def add_rms_norm_fast(x: Tensor, residual: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """`add_rms_norm_reference`'s contract in one kernel (same dtypes for `x` and `residual`)."""
    if x.dtype != residual.dtype or x.shape != residual.shape:
        raise ValueError(f"x {x.dtype}{tuple(x.shape)} and residual {residual.dtype}"
                         f"{tuple(residual.shape)} must match")  # fmt: skip
    d = x.shape[-1]
    x2, r2 = _rows(x), _rows(residual)
    y = torch.empty(x2.shape, dtype=torch.promote_types(x.dtype, weight.dtype), device=x.device)
    s = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        blk = _block(d)
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, weight, y, s, x2.stride(0), r2.stride(0), y.stride(0), s.stride(0), d, eps,
            HAS_RES=True, BLOCK=blk, num_warps=_warps(blk),
        )  # fmt: skip
    return y.view(x.shape), s.view(x.shape)


def gated_rms_norm_fast(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """`gated_rms_norm_reference`'s contract in one kernel."""
    if gate.shape != x.shape:
        raise ValueError(f"gate {tuple(gate.shape)} must match x {tuple(x.shape)}")
    d = x.shape[-1]
    x2, g2 = _rows(x), _rows(gate)
    y = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0]:
        blk = _block(d)
        _gated_rms_norm_kernel[(x2.shape[0],)](
            x2, g2, weight, y, x2.stride(0), g2.stride(0), y.stride(0), d, eps,
            BLOCK=blk, num_warps=_warps(blk),
        )  # fmt: skip
    return y.view(x.shape)

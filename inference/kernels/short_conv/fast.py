"""Triton decode step of the short causal conv: window gather, taps, SiLU, window shift, one kernel.

Replaces ~9 eager kernels per KDA layer (index_select, cat, casts, product, sum, SiLU, cast,
index_copy, and the q|k|v transpose copy): each program owns `BLOCK_C` channels of one sequence,
reads its window from the pool, writes the output straight into the `[parts, N, C / parts]`
layout the delta rule takes, and writes the shifted window back in place.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["short_conv_decode_fast"]


@triton.jit
def _short_conv_decode_kernel(
    X, POOL, SLOTS, WT, Y, stride_x, stride_ps, stride_pc, stride_wc, N, C, CP,
    W: tl.constexpr, WP: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    n = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    cmask = cols < C
    taps = tl.arange(0, WP)
    slot = tl.load(SLOTS + n)
    win_ptr = POOL + slot * stride_ps + cols[:, None] * stride_pc + taps[None, :]
    wmask = cmask[:, None] & (taps[None, :] < W)
    win = tl.load(win_ptr, mask=wmask, other=0.0)  # [BLOCK_C, WP], oldest first
    x = tl.load(X + n * stride_x + cols, mask=cmask, other=0.0).to(POOL.dtype.element_ty)
    wt = tl.load(WT + cols[:, None] * stride_wc + taps[None, :], mask=wmask, other=0.0).to(tl.float32)
    w_last = tl.load(WT + cols * stride_wc + W, mask=cmask, other=0.0).to(tl.float32)
    acc = tl.sum(win.to(tl.float32) * wt, axis=1) + x.to(tl.float32) * w_last
    y = acc * tl.sigmoid(acc)
    part = cols // CP
    tl.store(Y + part * (N * CP) + n * CP + (cols - part * CP), y.to(Y.dtype.element_ty), mask=cmask)
    # shift: new window[j] = old window[j + 1] for j < W - 1, and the new input at W - 1
    nxt = tl.load(win_ptr + 1, mask=cmask[:, None] & (taps[None, :] < W - 1), other=0.0)
    nxt = tl.where(taps[None, :] == W - 1, x[:, None], nxt)
    tl.store(win_ptr, nxt, mask=wmask)


def short_conv_decode_fast(x: Tensor, pool: Tensor, slots: Tensor, weight: Tensor, parts: int = 1) -> Tensor:
    """`short_conv_decode_reference`'s contract in one kernel."""
    n, c = x.shape
    w = pool.shape[-1]
    if pool.shape[1] != c or weight.shape != (c, w + 1) or c % parts or w < 1:
        raise ValueError(f"x [N, {c}], pool {tuple(pool.shape)}, weight {tuple(weight.shape)}, "
                         f"parts {parts}: need pool [S, C, W>=1], weight [C, W + 1], C % parts == 0")  # fmt: skip
    if pool.stride(-1) != 1 or x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x, pool and weight need unit stride in their last dim")
    y = torch.empty(parts, n, c // parts, dtype=x.dtype, device=x.device)
    if n:
        block = 256
        _short_conv_decode_kernel[(n, triton.cdiv(c, block))](
            x, pool, slots, weight, y, x.stride(0), pool.stride(0), pool.stride(1), weight.stride(0),
            n, c, c // parts, W=w, WP=triton.next_power_of_2(w + 1), BLOCK_C=block, num_warps=4,
        )  # fmt: skip
    return y

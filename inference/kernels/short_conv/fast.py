"""Triton short causal conv: the decode step and the varlen prefill.

Decode: window gather, taps, SiLU, window shift, one kernel. Replaces ~9 eager kernels per KDA
layer (index_select, cat, casts, product, sum, SiLU, cast, index_copy, and the q|k|v transpose
copy): each program owns `BLOCK_C` channels of one sequence, reads its window from the pool, writes
the output straight into the `[parts, N, C / parts]` layout the delta rule takes, and writes the
shifted window back in place.

Prefill (`causal_conv_varlen_fast`): each program owns `BLOCK_T` tokens x `BLOCK_C` channels of a
flat varlen batch and reads each tap's input from the chunk or, before the chunk's start, from the
sequence's window. The reference gathers a `[T, W + 1, C]` fp32 copy of the input (1.6 GB for a
16K-token chunk of a 2K-wide layer) and reduces it: on an H100 ~2.5 ms per KDA layer of a 16K
chunk in gather, product, sum and SiLU kernels.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["causal_conv_varlen_fast", "short_conv_decode_fast"]


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


# `T` (the step's token count) is not specialised on: a compiled kernel serves every length (an
# agent turn of 65 new tokens would otherwise compile a variant of its own on first use; measured
# in an H100 start-up benchmark: a 1 s second turn)
@triton.jit(do_not_specialize=["T"])
def _conv_varlen_kernel(
    X, WIN, WT, Y, SEQ, CU, T, C, stride_x, stride_wn, stride_wc, stride_wt, stride_y,
    W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_C: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
    cols = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    tmask, cmask = rows < T, cols < C
    seq = tl.load(SEQ + rows, mask=tmask, other=0)
    rel = rows - tl.load(CU + seq, mask=tmask, other=0)  # position inside the sequence's chunk
    acc = tl.zeros((BLOCK_T, BLOCK_C), dtype=tl.float32)
    m2 = tmask[:, None] & cmask[None, :]
    for j in tl.static_range(W + 1):  # tap j reads position rel + j - W (the last tap: the token itself)
        r = rel + (j - W)
        in_x = r >= 0
        xv = tl.load(
            X + (rows + (j - W))[:, None] * stride_x + cols[None, :], mask=m2 & in_x[:, None], other=0.0
        )
        wv = tl.load(
            WIN + seq[:, None] * stride_wn + cols[None, :] * stride_wc + (W + r)[:, None],
            mask=m2 & (~in_x)[:, None] & ((W + r) >= 0)[:, None], other=0.0,
        )  # fmt: skip
        tap = tl.load(WT + cols * stride_wt + j, mask=cmask, other=0.0).to(tl.float32)
        # the input goes through the window's dtype first, as the reference's concatenation does
        xin = xv.to(WIN.dtype.element_ty).to(tl.float32) + wv.to(tl.float32)
        acc += xin * tap[None, :]
    y = acc * tl.sigmoid(acc)
    tl.store(Y + rows[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty), mask=m2)


def causal_conv_varlen_fast(
    x: Tensor, window: Tensor, weight: Tensor, cu_seqlens: Tensor
) -> tuple[Tensor, Tensor]:
    """`inference.kernels.kda.causal_conv_varlen`'s contract: the conv + SiLU in one kernel, the
    new windows (the last `W` inputs of each sequence) by one gather of `N x W` rows."""
    n, c, w = window.shape
    t = x.shape[0]
    if weight.shape != (c, w + 1) or x.shape[-1] != c:
        raise ValueError(f"x [T, {c}], window {tuple(window.shape)}, weight {tuple(weight.shape)}: "
                         "need weight [C, W + 1]")  # fmt: skip
    if x.stride(-1) != 1 or weight.stride(-1) != 1:
        raise ValueError("x and weight need unit stride in their last dim")
    dev = x.device
    cu = cu_seqlens.to(device=dev, dtype=torch.long)
    lens = cu[1:] - cu[:-1]
    y = torch.empty(t, c, dtype=x.dtype, device=dev)
    if t:
        seq = torch.repeat_interleave(torch.arange(n, device=dev), lens, output_size=t)
        win = window if window.stride(-1) == 1 else window.contiguous()
        block_t, block_c = 32, 128
        _conv_varlen_kernel[(triton.cdiv(t, block_t), triton.cdiv(c, block_c))](
            x, win, weight, y, seq, cu, t, c, x.stride(0), win.stride(0), win.stride(1), weight.stride(0),
            y.stride(0), W=w, BLOCK_T=block_t, BLOCK_C=block_c, num_warps=4,
        )  # fmt: skip
    if w == 0:
        return y, window
    tail = lens[:, None] - w + torch.arange(w, device=dev)[None, :]  # [N, W] positions in the chunk
    from_x = (tail >= 0)[..., None]
    wv = window.permute(0, 2, 1)[torch.arange(n, device=dev)[:, None], (w + tail).clamp(0, w - 1)]
    if not t:  # no new tokens: the windows stay (and an empty x has no row to gather)
        return y, window
    xv = x[(cu[:-1, None] + tail.clamp(min=0)).clamp(max=t - 1)]  # [N, W, C]
    new = torch.where(from_x, xv.to(window.dtype), wv)
    return y, new.permute(0, 2, 1).contiguous()

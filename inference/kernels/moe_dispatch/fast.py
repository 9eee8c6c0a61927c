"""Triton kernels of the grouped-GEMM MoE's bookkeeping (see `reference.py` for the contracts).

At decode batch sizes each of these replaces a chain of launch-bound eager kernels: the pair sort
(argsort's radix sort, arange, searchsorted, the cast and the division: ~6) becomes one counting
sort, exact and stable, whose `O((T*k)^2)` comparisons are nothing for `T*k <= MAX_PAIRS`; the
combine (index_copy, fp32 cast, weight product, sum, cast back, the shared-expert add: 5-6) one
gather-and-sum per token; SwiGLU's two kernels one.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["MAX_PAIRS", "combine_fast", "silu_mul_fast", "sort_pairs_fast"]

MAX_PAIRS = 4096  # above it (prefill) the comparison count grows past what is worth it: reference


@triton.jit
def _sort_pairs_kernel(
    IDS, ORDER, TOK, PLACE, OFFS, N, E,
    K: tl.constexpr, EP: tl.constexpr, BI: tl.constexpr, BJ: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    i = pid * BI + tl.arange(0, BI)
    imask = i < N
    ei = tl.load(IDS + i, mask=imask, other=0)
    rank = tl.zeros([BI], dtype=tl.int32)
    for j0 in range(0, N, BJ):
        j = j0 + tl.arange(0, BJ)
        jmask = j < N
        ej = tl.load(IDS + j, mask=jmask, other=0)
        # pairs before i in a stable sort by expert: a lower expert, or the same one earlier
        before = (ej[None, :] < ei[:, None]) | ((ej[None, :] == ei[:, None]) & (j[None, :] < i[:, None]))
        rank += tl.sum((before & jmask[None, :]).to(tl.int32), axis=1)
    tl.store(ORDER + rank, i.to(tl.int64), mask=imask)
    tl.store(TOK + rank, (i // K).to(tl.int64), mask=imask)
    tl.store(PLACE + i, rank.to(tl.int64), mask=imask)
    if pid == 0:  # group ends: pairs routed to experts <= e
        e = tl.arange(0, EP)
        ends = tl.zeros([EP], dtype=tl.int32)
        for j0 in range(0, N, BJ):
            j = j0 + tl.arange(0, BJ)
            jmask = j < N
            ej = tl.load(IDS + j, mask=jmask, other=0)
            ends += tl.sum(((ej[None, :] <= e[:, None]) & jmask[None, :]).to(tl.int32), axis=1)
        tl.store(OFFS + e, ends, mask=e < E)


@triton.jit
def _combine_kernel(
    Y, PLACE, W, SHARED, OUT, stride_y, stride_s, stride_o, H,
    K: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_H: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    hs = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = hs < H
    acc = tl.zeros([BLOCK_H], dtype=tl.float32)
    for j in tl.static_range(K):  # the k slots in order, as the eager sum over them
        r = tl.load(PLACE + t * K + j)
        w = tl.load(W + t * K + j)
        acc += tl.load(Y + r * stride_y + hs, mask=hmask, other=0.0).to(tl.float32) * w
    out = acc.to(OUT.dtype.element_ty)
    if HAS_SHARED:  # `routed + shared` in the activation dtype: one more rounding, as eager
        sh = tl.load(SHARED + t * stride_s + hs, mask=hmask, other=0.0)
        out = (out.to(tl.float32) + sh.to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + t * stride_o + hs, out, mask=hmask)


@triton.jit
def _silu_mul_kernel(H, OUT, stride_h, stride_o, WIDTH, BLOCK: tl.constexpr):
    t = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < WIDTH
    g = tl.load(H + t * stride_h + cols, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(H + t * stride_h + WIDTH + cols, mask=mask, other=0.0)
    s = (g / (1.0 + tl.exp(-g))).to(OUT.dtype.element_ty)  # F.silu's rounding, then the product's
    tl.store(OUT + t * stride_o + cols, (s.to(tl.float32) * u.to(tl.float32)).to(OUT.dtype.element_ty),
             mask=mask)  # fmt: skip


def sort_pairs_fast(ids: Tensor, num_experts: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """`sort_pairs_reference`'s contract in one kernel (`T * k <= MAX_PAIRS`)."""
    t, top_k = ids.shape
    n = t * top_k
    if n > MAX_PAIRS:
        raise ValueError(f"sort_pairs_fast takes at most {MAX_PAIRS} pairs, got {n}: use the reference")
    flat = ids.reshape(-1).contiguous()
    order = torch.empty(n, dtype=torch.int64, device=ids.device)
    tok, place = torch.empty_like(order), torch.empty_like(order)
    offsets = torch.empty(num_experts, dtype=torch.int32, device=ids.device)
    bi = min(64, triton.next_power_of_2(max(n, 1)))
    _sort_pairs_kernel[(max(1, triton.cdiv(n, bi)),)](
        flat, order, tok, place, offsets, n, num_experts,
        K=top_k, EP=triton.next_power_of_2(num_experts), BI=bi, BJ=64, num_warps=4,
    )  # fmt: skip
    return order, tok, place, offsets


def combine_fast(y: Tensor, place: Tensor, weights: Tensor, shared: Tensor | None = None) -> Tensor:
    """`combine_reference`'s contract in one kernel."""
    t, top_k = weights.shape
    h = y.shape[1]
    if (
        y.shape[0] != t * top_k
        or place.shape != (t * top_k,)
        or (shared is not None and shared.shape != (t, h))
    ):
        raise ValueError(f"combine: y {tuple(y.shape)}, place {tuple(place.shape)}, weights "
                         f"{tuple(weights.shape)}: need y [T*k, H], place [T*k], shared [T, H]")  # fmt: skip
    if y.stride(-1) != 1 or (shared is not None and shared.stride(-1) != 1):
        raise ValueError("y and shared need unit stride in their last dim")
    out = torch.empty(t, h, dtype=y.dtype, device=y.device)
    if t:
        block = 1024
        sh = shared if shared is not None else out
        _combine_kernel[(t, triton.cdiv(h, block))](
            y, place, weights.contiguous(), sh, out, y.stride(0), sh.stride(0), out.stride(0), h,
            K=top_k, HAS_SHARED=shared is not None, BLOCK_H=block, num_warps=4,
        )  # fmt: skip
    return out


def silu_mul_fast(h: Tensor) -> Tensor:
    """`silu_mul_reference`'s contract in one kernel."""
    t, two_i = h.shape
    if two_i % 2 or h.stride(-1) != 1:
        raise ValueError(f"silu_mul needs [T, 2I] with unit stride in its last dim, got {tuple(h.shape)}")
    i = two_i // 2
    out = torch.empty(t, i, dtype=h.dtype, device=h.device)
    if t:
        block = 1024
        _silu_mul_kernel[(t, triton.cdiv(i, block))](
            h, out, h.stride(0), out.stride(0), i, BLOCK=block, num_warps=4
        )
    return out

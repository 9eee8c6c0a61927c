"""Fast paths of varlen causal MLA prefill: a Triton flash-attention kernel, and cuDNN split in two.

Triton (`mla_prefill_varlen_triton`): one launch for every sequence of the batch; each program
owns `BLOCK_M` queries of one (sequence, head), streams its keys with an online softmax (the
fully visible tiles without a mask, then the diagonal tiles masked), reads the per-head nope
keys and values straight from `kv_b_proj`'s output and the rope key shared by all heads from
`k_rope`: nothing `[L, S]` and no expanded `[S, H, Dqk]` key copy ever reaches HBM.

cuDNN (`mla_prefill_varlen_cudnn`): a chunk's keys split into the cached prefix (every query sees
all of it: plain non-causal attention, in fixed-size pieces, see `CUDNN_PIECE`) and the chunk
itself (a square causal block, which cuDNN's top-left `is_causal` gets right); the parts are
merged by their log-sum-exp. It needs the keys expanded to `[S, H, Dqk]` (a piece at a time)
and runs one sequence per call.
"""

# ruff: noqa: SIM108  (constexpr branches inside @triton.jit stay `if` statements, as Triton lowers them)

from __future__ import annotations

import os
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from torch import Tensor

from inference.kernels.mla_prefill.pieces import merge_by_lse, prefill_by_pieces, prefix_pieces

__all__ = [
    "CUDNN_PIECE", "merge_by_lse", "mla_prefill_varlen_cudnn", "mla_prefill_varlen_triton", "prefix_pieces",
]  # fmt: skip

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
_LOG2E = 1.4426950408889634
# Prefix keys per cuDNN call. cuDNN builds an execution plan per new (L, S) shape (~45 ms on the
# H200); cutting every chunk's prefix at fixed multiples of this leaves a long chunked prefill a
# handful of shapes (one full piece, the partial last piece, the causal diagonal) instead of a
# new one per chunk, for the price of an LSE merge of the pieces.
CUDNN_PIECE = 65536


@triton.jit
def _attend_tile(
    acc, m_i, l_i, qn, qr, kv_ptr, kr_ptr, k0, start, pos_q, s_len, s_kvt, s_kvh, s_krt, h,
    qk_scale,
    DN: tl.constexpr, DR: tl.constexpr, DV: tl.constexpr, DN_PAD: tl.constexpr,
    DR_PAD: tl.constexpr, DV_PAD: tl.constexpr, BLOCK_N: tl.constexpr, MASK: tl.constexpr,
    IEEE: tl.constexpr,
):  # fmt: skip
    offs_n = start + tl.arange(0, BLOCK_N)
    offs_dn = tl.arange(0, DN_PAD)
    offs_dv = tl.arange(0, DV_PAD)
    nmask = offs_n < s_len
    rows = (k0 + offs_n).to(tl.int64)
    if IEEE:
        cdt = tl.float32
    else:
        cdt = tl.bfloat16
    base = kv_ptr + rows[:, None] * s_kvt + h * s_kvh
    kn = tl.load(base + offs_dn[None, :], mask=nmask[:, None] & (offs_dn[None, :] < DN), other=0.0)
    v = tl.load(base + DN + offs_dv[None, :], mask=nmask[:, None] & (offs_dv[None, :] < DV), other=0.0)
    if IEEE:
        s = tl.dot(qn, tl.trans(kn.to(cdt)), input_precision="ieee")
    else:
        s = tl.dot(qn, tl.trans(kn.to(cdt)))
    if DR > 0:
        offs_dr = tl.arange(0, DR_PAD)
        kr = tl.load(
            kr_ptr + rows[:, None] * s_krt + offs_dr[None, :],
            mask=nmask[:, None] & (offs_dr[None, :] < DR), other=0.0,
        ).to(cdt)  # fmt: skip
        if IEEE:
            s += tl.dot(qr, tl.trans(kr), input_precision="ieee")
        else:
            s += tl.dot(qr, tl.trans(kr))
    s = s * qk_scale
    if MASK:
        s = tl.where((offs_n[None, :] <= pos_q[:, None]) & nmask[None, :], s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
    p = tl.exp2(s - m_safe[:, None])
    alpha = tl.exp2(m_i - m_safe)
    l_i = l_i * alpha + tl.sum(p, 1)
    if IEEE:
        pv = tl.dot(p, v.to(cdt), input_precision="ieee")
    else:
        pv = tl.dot(p.to(cdt), v.to(cdt))
    acc = acc * alpha[:, None] + pv
    return acc, m_new, l_i


@triton.jit
def _prefill_kernel(
    q_ptr, kv_ptr, kr_ptr, o_ptr, cu_q_ptr, cu_k_ptr, qk_scale,
    s_qt, s_qh, s_kvt, s_kvh, s_krt, s_ot, s_oh,
    H: tl.constexpr, DN: tl.constexpr, DR: tl.constexpr, DV: tl.constexpr,
    DN_PAD: tl.constexpr, DR_PAD: tl.constexpr, DV_PAD: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    mb = tl.program_id(0)
    nh = tl.program_id(1)
    n = nh // H
    h = nh % H
    q0 = tl.load(cu_q_ptr + n)
    q_len = tl.load(cu_q_ptr + n + 1) - q0
    if mb * BLOCK_M < q_len:
        k0 = tl.load(cu_k_ptr + n)
        s_len = tl.load(cu_k_ptr + n + 1) - k0
        ctx = s_len - q_len
        offs_m = mb * BLOCK_M + tl.arange(0, BLOCK_M)
        mmask = offs_m < q_len
        pos_q = ctx + offs_m
        if IEEE:
            cdt = tl.float32
        else:
            cdt = tl.bfloat16
        qrow = q_ptr + (q0 + offs_m).to(tl.int64)[:, None] * s_qt + h * s_qh
        offs_dn = tl.arange(0, DN_PAD)
        qn = tl.load(qrow + offs_dn[None, :], mask=mmask[:, None] & (offs_dn[None, :] < DN), other=0.0)
        qn = qn.to(cdt)
        qr = qn
        if DR > 0:
            offs_dr = tl.arange(0, DR_PAD)
            qr = tl.load(
                qrow + DN + offs_dr[None, :], mask=mmask[:, None] & (offs_dr[None, :] < DR), other=0.0
            ).to(cdt)
        m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, DV_PAD], tl.float32)
        # keys < ctx + mb * BLOCK_M + 1 are visible to every query of this block: no mask there
        full_end = ((ctx + mb * BLOCK_M + 1) // BLOCK_N) * BLOCK_N
        hi = tl.minimum(s_len, ctx + (mb + 1) * BLOCK_M)
        for start in range(0, full_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, qn, qr, kv_ptr, kr_ptr, k0, start, pos_q, s_len, s_kvt, s_kvh, s_krt,
                h, qk_scale, DN, DR, DV, DN_PAD, DR_PAD, DV_PAD, BLOCK_N, False, IEEE,
            )  # fmt: skip
        for start in range(full_end, hi, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                acc, m_i, l_i, qn, qr, kv_ptr, kr_ptr, k0, start, pos_q, s_len, s_kvt, s_kvh, s_krt,
                h, qk_scale, DN, DR, DV, DN_PAD, DR_PAD, DV_PAD, BLOCK_N, True, IEEE,
            )  # fmt: skip
        out = acc / tl.where(l_i > 0.0, l_i, 1.0)[:, None]
        offs_dv = tl.arange(0, DV_PAD)
        optr = o_ptr + (q0 + offs_m).to(tl.int64)[:, None] * s_ot + h * s_oh + offs_dv[None, :]
        tl.store(optr, out.to(o_ptr.dtype.element_ty), mask=mmask[:, None] & (offs_dv[None, :] < DV))


_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn}, num_warps=w, num_stages=st)
    for bm, bn, w, st in ((128, 64, 8, 2), (128, 64, 8, 3), (128, 128, 8, 2))
]  # fmt: skip
# fp32 pools: (BLOCK_M, BLOCK_N, num_warps, num_stages)
_FP32_TILE = (32, 32, 4, 1)
_tuned_prefill_kernel = triton.autotune(configs=_CONFIGS, key=["H", "DN", "DR", "DV", "IEEE"])(
    _prefill_kernel
)


def _pad(x: int) -> int:
    return max(16, triton.next_power_of_2(x))


def mla_prefill_varlen_triton(
    q: Tensor,
    kv: Tensor,
    k_rope: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    *,
    max_q: int,
    scale: float,
    nope_dim: int,
) -> Tensor:
    """Same contract as `mla_prefill_varlen_reference`; one launch for the whole batch."""
    t, h, dq = q.shape
    dr = dq - nope_dim
    dv = kv.shape[-1] - nope_dim
    if k_rope.shape[-1] != dr:
        raise ValueError(f"k_rope has {k_rope.shape[-1]} dims, q's rope part {dr}")
    if q.stride(-1) != 1 or kv.stride(-1) != 1 or (dr and k_rope.stride(-1) != 1):
        raise ValueError("q, kv and k_rope need a contiguous last dimension")
    out = torch.empty(t, h, dv, dtype=q.dtype, device=q.device)
    n = cu_q.shape[0] - 1
    if t == 0 or n == 0:
        return out
    kr = k_rope if dr else kv
    ieee = q.dtype == torch.float32 or _INTERPRET
    args = (
        q, kv, kr, out, cu_q, cu_k, scale * _LOG2E,
        q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), kr.stride(0), out.stride(0), out.stride(1),
    )  # fmt: skip
    meta = dict(H=h, DN=nope_dim, DR=dr, DV=dv, DN_PAD=_pad(nope_dim), DR_PAD=_pad(max(dr, 1)),
                DV_PAD=_pad(dv), IEEE=ieee)  # fmt: skip
    if _INTERPRET:
        _prefill_kernel[(triton.cdiv(max_q, 16), n * h)](*args, **meta, BLOCK_M=16, BLOCK_N=16)
    elif ieee:
        # fp32 (exactness checks, not serving): one small fixed tile, no autotuning. The tuned
        # configs' 128-query fp32 tiles compile slowly and spill, and autotuning compiles all
        # three per new key: the fp32 end-to-end check spent its time limit there
        bm, bn, warps, stages = _FP32_TILE
        _prefill_kernel[(triton.cdiv(max_q, bm), n * h)](
            *args, **meta, BLOCK_M=bm, BLOCK_N=bn, num_warps=warps, num_stages=stages
        )
    else:

        def grid(cfg: dict) -> tuple[int, int]:
            return (triton.cdiv(max_q, cfg["BLOCK_M"]), n * h)

        _tuned_prefill_kernel[grid](*args, **meta)
    return out


def _cudnn(q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float) -> tuple[Tensor, Tensor]:
    """`[1, H, L, D]` inputs -> (out `[1, H, L, Dv]`, natural-log LSE `[1, H, L]`) via cuDNN."""
    res = torch.ops.aten._scaled_dot_product_cudnn_attention(
        q, k, v, None, True, 0.0, causal, False, scale=scale
    )
    return res[0], res[1].reshape(q.shape[0], q.shape[1], q.shape[2])


def mla_prefill_varlen_cudnn(
    q: Tensor,
    kv: Tensor,
    k_rope: Tensor,
    cu_q: Tensor,
    cu_k: Tensor,
    *,
    max_q: int,
    scale: float,
    nope_dim: int,
    piece: int = CUDNN_PIECE,
) -> Tensor:
    """Same contract as `mla_prefill_varlen_reference`; cuDNN, one sequence per call (see module)."""
    del max_q
    t, h, _ = q.shape
    dv = kv.shape[-1] - nope_dim
    out = torch.empty(t, h, dv, dtype=q.dtype, device=q.device)
    cq, ck = cu_q.tolist(), cu_k.tolist()

    def keys(k0: int) -> Callable[[int, int], tuple[Tensor, Tensor]]:
        def at(a: int, b: int) -> tuple[Tensor, Tensor]:
            """Keys `[a, b)` of the sequence as cuDNN's `[1, H, S, D]` (rope part broadcast to heads)."""
            a, b = k0 + a, k0 + b
            kn = kv[a:b, :, :nope_dim]
            kr = k_rope[a:b, None, :].expand(b - a, h, k_rope.shape[-1])
            k = torch.cat([kn, kr], dim=-1).transpose(0, 1)[None]
            return k, kv[a:b, :, nope_dim:].transpose(0, 1)[None]

        return at

    for i in range(len(cq) - 1):
        q0, q1, k0, k1 = cq[i], cq[i + 1], ck[i], ck[i + 1]
        qq = q[q0:q1].transpose(0, 1)[None]
        o = prefill_by_pieces(qq, keys(k0), k1 - k0, scale=scale, piece=piece, part=_cudnn)
        out[q0:q1] = o[0].transpose(0, 1).to(q.dtype)
    return out

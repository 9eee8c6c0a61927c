"""The MoE block at a handful of tokens as two GEMV kernels (contract in `reference.py`).

At batch 1 the grouped path (`moe_dispatch` sort, `moe_gemm` up and down, combine, and the shared
experts' two cuBLAS GEMVs and SwiGLU: seven kernels a layer) is latency-bound: the grouped
kernels give each expert's column block to one program, so only `k` experts' worth of programs
read weights (the routed up GEMM read at ~41% of the H200's bandwidth, down at ~29%). Here no
sort is needed: a (token, slot) pair reads its expert's weights directly.

- `_up_kernel`, one program per (pair, column block), the shared experts being one more "pair"
  per token: gate and up rows against the token's row, SwiGLU on the fp32 sums, one store.
- `_down_kernel`, one program per (token, column block): each slot's down rows against its
  activation, weighted and summed in slot order (no atomics: deterministic), plus the shared
  experts' down rows; one store of the block's output.

Both are plain multiply-and-sum GEMVs over `[BLOCK_N, BLOCK_K]` weight tiles read along K (no
`tl.dot`: a 16-row minimum would be wasted on one row). The weight reads of a pair are `k + 1`
experts' worth per token, against the grouped path's distinct experts, so the rule
(`moe_gemv_applies`) keeps this path to a few tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["CANDIDATE_TILES", "DOWN_TILE", "MAX_TOKENS", "UP_TILE", "moe_gemv_fast"]

# H100 (`benchmarks/kernels.py --sections moe_gemv`, benchmark config, graph replay, L2 flushed):
# the block at 1 / 2 / 4 / 8 tokens 28.6 / 38.4 / 60.7 / 88.6 us vs the grouped path's 40.1 / 53.2
# / 71.6 / 95.1 us; batch-1 decode 703 vs 628 tok/s (`docs/results/moe_gemv_h100.json`). The
# path is kept to the sizes decoded end to end with it; at more tokens the grouped path reads
# fewer weight bytes (the distinct experts, not k + 1 per token).
MAX_TOKENS = 4
# (BLOCK_N, BLOCK_K, num_warps, num_stages); the sweep times CANDIDATE_TILES at one token (whole
# block: best up (8, 256, 4, 3) 27.6 us, down (8, 256, 4, 4) 26.1 us, these 27.7 us) and the
# `gpu` test checks them against the reference
UP_TILE = (16, 256, 4, 3)
DOWN_TILE = (16, 256, 4, 3)
CANDIDATE_TILES = tuple(
    (bn, bk, w, st) for bn in (8, 16, 32) for bk in (128, 256, 512) for w, st in ((4, 3), (8, 3), (4, 4))
    if bn * bk <= 8192
)  # fmt: skip


@triton.jit
def _up_kernel(
    X, IDS, W, SW, ACT, stride_x, stride_we, stride_wn, stride_sn, stride_a, H, INTER, S_INTER, PAIRS,
    TOP_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    p = tl.program_id(0)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    if p < PAIRS:  # a routed (token, slot) pair
        t = p // TOP_K
        base = W + tl.load(IDS + p) * stride_we
        width = INTER
        row = stride_wn
    else:  # the shared experts of token p - PAIRS
        t = p - PAIRS
        base = SW
        width = S_INTER
        row = stride_sn
    nmask = ns < width
    gate = tl.zeros([BLOCK_N], dtype=tl.float32)
    up = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < H
        xv = tl.load(X + t * stride_x + ks, mask=kmask, other=0.0).to(tl.float32)
        wmask = nmask[:, None] & kmask[None, :]
        wg = tl.load(base + ns[:, None] * row + ks[None, :], mask=wmask, other=0.0)
        wu = tl.load(base + (width + ns[:, None]) * row + ks[None, :], mask=wmask, other=0.0)
        gate += tl.sum(wg.to(tl.float32) * xv[None, :], axis=1)
        up += tl.sum(wu.to(tl.float32) * xv[None, :], axis=1)
    act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(ACT + p * stride_a + ns, act.to(ACT.dtype.element_ty), mask=nmask)


@triton.jit
def _row_dot(A, Wrow, stride_wn, ns, nmask, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
             STAGES: tl.constexpr):  # fmt: skip
    """fp32 `W[ns, :K] @ A[:K]` of one activation row."""
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
        ks = k0 + tl.arange(0, BLOCK_K)
        kmask = ks < K
        a = tl.load(A + ks, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(
            Wrow + ns[:, None] * stride_wn + ks[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0
        )
        acc += tl.sum(w.to(tl.float32) * a[None, :], axis=1)
    return acc


@triton.jit
def _down_kernel(
    ACT, IDS, WTS, W2, SW2, OUT, stride_a, stride_we, stride_wn, stride_sn, stride_o, H, INTER, S_INTER,
    PAIRS, TOP_K: tl.constexpr, HAS_SHARED: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < H
    acc = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in tl.static_range(TOP_K):
        p = t * TOP_K + j
        e = tl.load(IDS + p)
        part = _row_dot(ACT + p * stride_a, W2 + e * stride_we, stride_wn, ns, nmask, INTER, BLOCK_N, BLOCK_K,
                        STAGES)  # fmt: skip
        acc += tl.load(WTS + p) * part
    if HAS_SHARED:
        acc += _row_dot(ACT + (PAIRS + t) * stride_a, SW2, stride_sn, ns, nmask, S_INTER, BLOCK_N, BLOCK_K,
                        STAGES)  # fmt: skip
    tl.store(OUT + t * stride_o + ns, acc.to(OUT.dtype.element_ty), mask=nmask)


def _check(x: Tensor, weights: Tensor, ids: Tensor, w13: Tensor, w2: Tensor,
           shared: tuple[Tensor, Tensor] | None) -> None:  # fmt: skip
    t, h = x.shape
    e, two_i, h13 = w13.shape
    ok = (
        h13 == h and two_i % 2 == 0 and w2.shape == (e, h, two_i // 2)
        and ids.shape == weights.shape and ids.shape[0] == t and ids.dtype == torch.int64
        and weights.dtype == torch.float32 and x.stride(-1) == 1 and w13.stride(-1) == 1 and w2.stride(-1) == 1
        and ids.is_contiguous() and weights.is_contiguous()
    )  # fmt: skip
    if shared is not None:
        sw13, sw2 = shared
        ok = ok and sw13.dim() == 2 and sw13.shape[1] == h and sw13.shape[0] % 2 == 0
        ok = ok and sw2.shape == (h, sw13.shape[0] // 2) and sw13.stride(-1) == 1 and sw2.stride(-1) == 1
    if not ok:
        raise ValueError(
            f"moe_gemv: need x [T, H], weights [T, k] fp32, ids [T, k] int64 (contiguous), w13 [E, 2I, H], "
            f"w2 [E, H, I], shared (gate|up [2S, H], down [H, S]) with unit stride along K; got x "
            f"{tuple(x.shape)}, weights {tuple(weights.shape)} {weights.dtype}, ids {tuple(ids.shape)} "
            f"{ids.dtype}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}, shared "
            f"{None if shared is None else [tuple(s.shape) for s in shared]}"
        )


def moe_gemv_fast(
    x: Tensor,
    weights: Tensor,
    ids: Tensor,
    w13: Tensor,
    w2: Tensor,
    shared: tuple[Tensor, Tensor] | None = None,
    up_tile: tuple[int, int, int, int] = UP_TILE,
    down_tile: tuple[int, int, int, int] = DOWN_TILE,
) -> Tensor:
    """`moe_gemv_reference`'s contract in two kernels; the tiles `(BLOCK_N, BLOCK_K, num_warps,
    num_stages)` are for the sweep."""
    _check(x, weights, ids, w13, w2, shared)
    t, h = x.shape
    top_k, i = ids.shape[1], w13.shape[1] // 2
    sw13, sw2 = shared if shared is not None else (w13[0], w2[0])  # unread without shared experts
    s = sw13.shape[0] // 2 if shared is not None else 0
    pairs = t * top_k
    out = torch.empty_like(x)
    if t == 0:
        return out
    act = torch.empty(pairs + (t if shared is not None else 0), max(i, s), dtype=x.dtype, device=x.device)
    bn, bk, warps, stages = up_tile
    _up_kernel[(act.shape[0], triton.cdiv(max(i, s), bn))](
        x, ids, w13, sw13, act, x.stride(0), w13.stride(0), w13.stride(1), sw13.stride(0), act.stride(0),
        h, i, s, pairs, TOP_K=top_k, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages, num_warps=warps,
    )  # fmt: skip
    bn, bk, warps, stages = down_tile
    _down_kernel[(t, triton.cdiv(h, bn))](
        act, ids, weights, w2, sw2, out, act.stride(0), w2.stride(0), w2.stride(1), sw2.stride(0), out.stride(0),
        h, i, s, pairs, TOP_K=top_k, HAS_SHARED=shared is not None, BLOCK_N=bn, BLOCK_K=bk, STAGES=stages,
        num_warps=warps,
    )  # fmt: skip
    return out

"""Triton lightning-indexer scores over the paged indexer-key cache, then the exact radix top-k.

Scores: one program scores a run of `BLOCK_N`-key tiles of one query row for all indexer heads
(one tensor-core dot `[BLOCK_N, D] x [D, Hi]` per tile, the queries loaded once per program, the
key loads pipelined), applies ReLU and the per-head weights and sums the heads in registers:
only the `[rows, S]` head-summed scores of the visible keys reach HBM (never `[rows, Hi, S]`),
and rows go in blocks of at most `SCORE_BUDGET` scores, so a long prefill never holds its full
`[L, S]` score matrix. Prefill rows (`rows_per_program` 2 or 4) go to a kernel that reads each
key tile once for that many rows of one sequence (the single-row kernel is bound by re-reading
the keys per row, not by the tensor cores). FP8 keys (`index_scales` given): the queries are
quantised per head to e4m3 in the program and the dot runs on the fp8 tensor cores; since every
scale is positive,
`relu(s_q s_k x) = s_q s_k relu(x)`, so the query scale folds into the head weights and the key
scale multiplies the head sum once per key. The selection is `inference.kernels.topk.fast`.
"""

# ruff: noqa: SIM108  (constexpr branches inside @triton.jit stay `if` statements, as Triton lowers them)

from __future__ import annotations

import functools
import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from inference.kernels.dsa.reference import SCORE_BUDGET, selected_count
from inference.kernels.topk.fast import select_rows
from inference.model.cache_tensors import FP8_MAX

__all__ = ["SCORE_TILE", "dsa_scores_fast", "dsa_topk_paged_fast"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# the scoring kernel's (BLOCK_N, num_warps, num_stages) per key dtype. H200 sweep of
# benchmarks/kernels.py (`dsa`, b32 x 128K, graph replay): FP8 (128, 4, 3) 157.8 us = 3.51 TB/s,
# (128, 4, 4) 157.5, (256, 8, 3) 168.0, (128, 8, 3) 193.0, (64, 4, 5) 205.4, (64, 4, 3) 212.4;
# bf16 (128, 4, 3) 302 us = 3.56 TB/s (not swept); fp32 (exactness checks) not timed
SCORE_TILE = {"bf16": (128, 4, 3), "fp8": (128, 4, 3), "fp32": (64, 4, 2)}
_PROGRAMS_PER_SM = 4
_FP8_MAX = tl.constexpr(FP8_MAX)  # a global a @triton.jit body may read


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@triton.jit
def _row_q(q_ptr, w_ptr, t, s_qt, s_qh, s_wt, scale, offs_h, offs_d, hmask, dmask, FP8: tl.constexpr,
           IEEE: tl.constexpr):  # fmt: skip
    """One query row's indexer queries `[HI_PAD, D_PAD]` in the dot's dtype and its head weights
    (FP8: quantised per head, the query scale folded into the weights)."""
    q = tl.load(
        q_ptr + t.to(tl.int64) * s_qt + offs_h[:, None] * s_qh + offs_d[None, :],
        mask=hmask[:, None] & dmask[None, :], other=0.0,
    ).to(tl.float32)  # fmt: skip
    w = tl.load(w_ptr + t.to(tl.int64) * s_wt + offs_h, mask=hmask, other=0.0).to(tl.float32) * scale
    if FP8:
        amax = tl.max(tl.abs(q), 1)
        q_scale = tl.where(amax > 0.0, amax / _FP8_MAX, 1.0)
        q = (q / q_scale[:, None]).to(tl.float8e4nv)
        w = w * q_scale
        if IEEE:
            q = q.to(tl.float32)
    elif IEEE:
        q = q.to(tl.float32)
    else:
        q = q.to(tl.bfloat16)
    return q, w


@triton.jit
def _row_tile(k, q, w, FP8: tl.constexpr, IEEE: tl.constexpr):
    """Head-summed ReLU scores `[BLOCK_N]` of one key tile for one query row (keys on the MMA's M
    side, heads on N: the head sum reduces inside each thread plus a few lane shuffles)."""
    if IEEE:
        s = tl.dot(k.to(tl.float32), tl.trans(q), input_precision="ieee")
    elif FP8:
        s = tl.dot(k, tl.trans(q))
    else:
        s = tl.dot(k.to(tl.bfloat16), tl.trans(q))
    return tl.sum(tl.maximum(s, 0.0) * w[None, :], 1)


@triton.jit
def _key_tile(pool_ptr, bt_ptr, trow, s_bt, s_pb, offs_n, valid, offs_d, dmask, PAGE: tl.constexpr,
              D: tl.constexpr):  # fmt: skip
    """Keys `offs_n` of block-table row `trow`: the tile `[BLOCK_N, D_PAD]` and each key's block / slot."""
    blk = tl.load(bt_ptr + trow * s_bt + offs_n // PAGE, mask=valid, other=0).to(tl.int64)
    slot = offs_n % PAGE
    k = tl.load(
        pool_ptr + blk[:, None] * s_pb + slot[:, None] * D + offs_d[None, :],
        mask=valid[:, None] & dmask[None, :], other=0.0,
    )  # fmt: skip
    return k, blk, slot


@triton.jit
def _score_kernel(
    q_ptr, w_ptr, pool_ptr, ks_ptr, bt_ptr, lens_ptr, trow_ptr, out_ptr, row0, max_keys,
    keys_per_prog, scale, s_qt, s_qh, s_wt, s_pb, s_kb, s_bt, s_ot,
    HI: tl.constexpr, HI_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TROW: tl.constexpr, FP8: tl.constexpr,
    IEEE: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    local = tl.program_id(0)
    t = row0 + local
    seq_len = tl.load(lens_ptr + t).to(tl.int32)
    if HAS_TROW:
        trow = tl.load(trow_ptr + t).to(tl.int64)
    else:
        trow = t.to(tl.int64)
    lo = tl.program_id(1) * keys_per_prog
    hi = tl.minimum(lo + keys_per_prog, max_keys)
    vis = tl.minimum(hi, seq_len)  # keys past the row's length: neither scored nor read by the top-k
    offs_h = tl.arange(0, HI_PAD)
    offs_d = tl.arange(0, D_PAD)
    hmask = offs_h < HI
    dmask = offs_d < D
    q, w = _row_q(q_ptr, w_ptr, t, s_qt, s_qh, s_wt, scale, offs_h, offs_d, hmask, dmask, FP8, IEEE)
    orow = out_ptr + local.to(tl.int64) * s_ot
    for start in tl.range(lo, vis, BLOCK_N, num_stages=STAGES):
        offs_n = start + tl.arange(0, BLOCK_N)
        valid = offs_n < vis
        k, blk, slot = _key_tile(pool_ptr, bt_ptr, trow, s_bt, s_pb, offs_n, valid, offs_d, dmask, PAGE, D)
        score = _row_tile(k, q, w, FP8, IEEE)
        if FP8:
            score = score * tl.load(ks_ptr + blk * s_kb + slot, mask=valid, other=0.0)
        tl.store(orow + offs_n, tl.where(valid, score, float("-inf")), mask=offs_n < hi)


@triton.jit
def _score_rows_kernel(
    q_ptr, w_ptr, pool_ptr, ks_ptr, bt_ptr, lens_ptr, trow_ptr, out_ptr, row0, n_rows, max_keys,
    keys_per_prog, scale, s_qt, s_qh, s_wt, s_pb, s_kb, s_bt, s_ot,
    R: tl.constexpr, HI: tl.constexpr, HI_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, FP8: tl.constexpr, IEEE: tl.constexpr,
    STAGES: tl.constexpr,
):  # fmt: skip
    """Prefill rows: one program scores `R` (<= 4) consecutive query rows over a run of key tiles,
    each key tile loaded once for all `R` rows (the single-row kernel re-reads it per row, which
    bounds it by L2 bandwidth, not the tensor cores). Rows of one group normally share their
    sequence (prefill rows come in runs per sequence); a group straddling two sequences takes one
    pass per row over that row's own keys, storing only that row."""
    g0 = tl.program_id(0) * R
    offs_h = tl.arange(0, HI_PAD)
    offs_d = tl.arange(0, D_PAD)
    hmask = offs_h < HI
    dmask = offs_d < D
    lo = tl.program_id(1) * keys_per_prog
    hi = tl.minimum(lo + keys_per_prog, max_keys)
    # rows past `n_rows` repeat the group's first row and store nothing
    t0 = row0 + g0
    q0, w0 = _row_q(q_ptr, w_ptr, t0, s_qt, s_qh, s_wt, scale, offs_h, offs_d, hmask, dmask, FP8, IEEE)
    v0 = tl.minimum(hi, tl.load(lens_ptr + t0).to(tl.int32))
    r0 = tl.load(trow_ptr + t0).to(tl.int64)
    ok1 = g0 + 1 < n_rows
    t1 = tl.where(ok1, t0 + 1, t0)
    q1, w1 = q0, w0
    v1 = v0
    r1 = r0
    if R > 1:
        q1, w1 = _row_q(q_ptr, w_ptr, t1, s_qt, s_qh, s_wt, scale, offs_h, offs_d, hmask, dmask, FP8, IEEE)
        v1 = tl.minimum(hi, tl.load(lens_ptr + t1).to(tl.int32))
        r1 = tl.load(trow_ptr + t1).to(tl.int64)
    ok2 = g0 + 2 < n_rows
    ok3 = g0 + 3 < n_rows
    t2 = tl.where(ok2, t0 + 2, t0)
    t3 = tl.where(ok3, t0 + 3, t0)
    q2, w2, q3, w3 = q0, w0, q0, w0
    v2, v3 = v0, v0
    r2, r3 = r0, r0
    if R > 2:
        q2, w2 = _row_q(q_ptr, w_ptr, t2, s_qt, s_qh, s_wt, scale, offs_h, offs_d, hmask, dmask, FP8, IEEE)
        q3, w3 = _row_q(q_ptr, w_ptr, t3, s_qt, s_qh, s_wt, scale, offs_h, offs_d, hmask, dmask, FP8, IEEE)
        v2 = tl.minimum(hi, tl.load(lens_ptr + t2).to(tl.int32))
        v3 = tl.minimum(hi, tl.load(lens_ptr + t3).to(tl.int32))
        r2 = tl.load(trow_ptr + t2).to(tl.int64)
        r3 = tl.load(trow_ptr + t3).to(tl.int64)
    same = (r1 == r0) & (r2 == r0) & (r3 == r0)
    passes = tl.where(same, 1, R)
    for p in range(0, passes):
        # the pass's table row and key range: all rows' (shared) or row p's alone
        trow = tl.where(same | (p == 0), r0, tl.where(p == 1, r1, tl.where(p == 2, r2, r3)))
        vp = tl.where(p == 0, v0, tl.where(p == 1, v1, tl.where(p == 2, v2, v3)))
        vis = tl.where(same, tl.maximum(tl.maximum(v0, v1), tl.maximum(v2, v3)), vp)
        st0 = same | (p == 0)
        st1 = ok1 & (same | (p == 1))
        st2 = ok2 & (same | (p == 2))
        st3 = ok3 & (same | (p == 3))
        for start in tl.range(lo, vis, BLOCK_N, num_stages=STAGES):
            offs_n = start + tl.arange(0, BLOCK_N)
            valid = offs_n < vis
            k, blk, slot = _key_tile(
                pool_ptr, bt_ptr, trow, s_bt, s_pb, offs_n, valid, offs_d, dmask, PAGE, D
            )
            ks = 1.0
            if FP8:
                ks = tl.load(ks_ptr + blk * s_kb + slot, mask=valid, other=0.0)
            out = out_ptr + (g0.to(tl.int64) * s_ot) + offs_n
            inside = offs_n < hi
            sc = _row_tile(k, q0, w0, FP8, IEEE) * ks
            tl.store(out, tl.where(offs_n < v0, sc, float("-inf")), mask=inside & st0)
            if R > 1:
                sc = _row_tile(k, q1, w1, FP8, IEEE) * ks
                tl.store(out + s_ot, tl.where(offs_n < v1, sc, float("-inf")), mask=inside & st1)
            if R > 2:
                sc = _row_tile(k, q2, w2, FP8, IEEE) * ks
                tl.store(out + 2 * s_ot, tl.where(offs_n < v2, sc, float("-inf")), mask=inside & st2)
                sc = _row_tile(k, q3, w3, FP8, IEEE) * ks
                tl.store(out + 3 * s_ot, tl.where(offs_n < v3, sc, float("-inf")), mask=inside & st3)


def _tile(index_pool: Tensor) -> tuple[int, int, int]:
    kind = {torch.float8_e4m3fn: "fp8", torch.float32: "fp32"}.get(index_pool.dtype, "bf16")
    return SCORE_TILE[kind]


def dsa_scores_fast(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scores: Tensor,
    row0: int,
    *,
    index_scales: Tensor | None = None,
    table_rows: Tensor | None = None,
    score_tile: tuple[int, int, int] | None = None,
    rows_per_program: int = 1,
) -> None:
    """Write the scores of rows `row0 : row0 + scores.shape[0]` into `scores` `[rows, S]` fp32
    (`-inf` at the invisible keys of the first `S` positions; nothing past a row's length is read).
    `rows_per_program` 2 or 4 (with `table_rows`): the prefill kernel, each key tile read once for
    that many consecutive rows (exact for any rows; fast when runs of rows share a sequence)."""
    rows, max_keys = scores.shape
    hi, d = q_index.shape[1:]
    page = index_pool.shape[1]
    fp8 = index_scales is not None
    ieee = index_pool.dtype == torch.float32 or _INTERPRET
    block_n, warps, stages = score_tile or _tile(index_pool)
    if _INTERPRET:
        block_n = 16
    if rows_per_program not in (1, 2, 4):
        raise ValueError(f"rows_per_program must be 1, 2 or 4, got {rows_per_program}")
    group = rows_per_program if table_rows is not None else 1
    # tiles per program: about `_PROGRAMS_PER_SM` programs per SM in all (shape-only: graph-safe)
    sms = _sm_count(q_index.device.index or 0) if q_index.is_cuda else 4
    tiles = triton.cdiv(max_keys, block_n)
    groups = triton.cdiv(rows, group)
    keys_per_prog = block_n * max(1, triton.cdiv(groups * tiles, _PROGRAMS_PER_SM * sms))
    trow = table_rows if table_rows is not None else seq_lens
    ks = index_scales if fp8 else seq_lens
    if group > 1:
        _score_rows_kernel[(groups, triton.cdiv(max_keys, keys_per_prog))](
            q_index, weights, index_pool, ks, block_tables, seq_lens, trow, scores, row0, rows, max_keys,
            keys_per_prog, d**-0.5, q_index.stride(0), q_index.stride(1), weights.stride(0),
            index_pool.stride(0), index_scales.stride(0) if fp8 else 0, block_tables.stride(0),
            scores.stride(0),
            R=group, HI=hi, HI_PAD=max(16, triton.next_power_of_2(hi)), D=d,
            D_PAD=max(32 if fp8 else 16, triton.next_power_of_2(d)),
            PAGE=page, BLOCK_N=block_n, FP8=fp8, IEEE=ieee, STAGES=stages, num_warps=warps,
        )  # fmt: skip
        return
    _score_kernel[(rows, triton.cdiv(max_keys, keys_per_prog))](
        q_index, weights, index_pool, ks, block_tables, seq_lens, trow, scores, row0, max_keys,
        keys_per_prog, d**-0.5, q_index.stride(0), q_index.stride(1), weights.stride(0),
        index_pool.stride(0), index_scales.stride(0) if fp8 else 0, block_tables.stride(0),
        scores.stride(0),
        HI=hi, HI_PAD=max(16, triton.next_power_of_2(hi)), D=d,
        D_PAD=max(32 if fp8 else 16, triton.next_power_of_2(d)),  # an fp8 MMA step takes K = 32
        PAGE=page, BLOCK_N=block_n, HAS_TROW=table_rows is not None, FP8=fp8, IEEE=ieee,
        STAGES=stages, num_warps=warps,
    )  # fmt: skip


def dsa_topk_paged_fast(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    topk: int,
    table_rows: Tensor | None = None,
    index_scales: Tensor | None = None,
    topk_rows: Tensor | None = None,
    score_tile: tuple[int, int, int] | None = None,
    rows_per_program: int = 1,
) -> Tensor:
    """Same contract as `dsa_topk_paged_reference`; `score_tile` overrides `SCORE_TILE`;
    `rows_per_program` as in `dsa_scores_fast`."""
    t = q_index.shape[0]
    page = index_pool.shape[1]
    max_keys = block_tables.shape[1] * page
    k = selected_count(topk, max_keys)
    out = torch.empty((t, k), dtype=torch.long, device=q_index.device)  # every entry is written
    if t == 0:
        return out
    if index_pool.stride(2) != 1 or index_pool.stride(1) != index_pool.shape[2]:
        raise ValueError("index_pool rows must be contiguous within a block")
    q_index = q_index.contiguous()
    weights = weights.contiguous()
    block_tables = block_tables.contiguous()
    seq_lens = seq_lens.contiguous()
    trows = table_rows.contiguous() if table_rows is not None else None
    krows = topk_rows.contiguous() if topk_rows is not None else None
    step = max(1, min(t, SCORE_BUDGET // max_keys))
    scores = torch.empty(step, max_keys, dtype=torch.float32, device=q_index.device)
    for r0 in range(0, t, step):
        rows = min(step, t - r0)
        dsa_scores_fast(
            q_index, weights, index_pool, block_tables, seq_lens, scores[:rows], r0,
            index_scales=index_scales, table_rows=trows, score_tile=score_tile,
            rows_per_program=rows_per_program,
        )  # fmt: skip
        select_rows(scores[:rows], seq_lens, out, r0, krows)
    return out

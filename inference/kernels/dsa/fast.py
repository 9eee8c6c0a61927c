"""Triton lightning-indexer scores over the paged indexer-key cache, then an exact radix top-k.

Scores: one program scores a run of `BLOCK_N`-key tiles of one query row for all indexer heads
(one tensor-core dot `[Hi, D] x [D, BLOCK_N]` per tile, the queries loaded once per program, the
key loads pipelined), applies ReLU and the per-head weights and sums the heads in registers:
only the `[rows, S]` head-summed scores of the visible keys reach HBM (never `[rows, Hi, S]`), and rows go in blocks
of at most `SCORE_BUDGET` scores, so a long prefill never holds its full `[L, S]` score matrix.

Top-k (`_topk_kernel`): one program per row finds the k-th largest score exactly by a radix
select on the scores' order-preserving 32-bit keys (four 8-bit histogram passes over the row,
which sits in L2 right after scoring), then writes the positions of the selected keys in
ascending order (ties at the threshold: the lowest positions). No sort: the attention over the
selection does not care about order, and ascending positions read the paged cache in order.
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

__all__ = ["dsa_topk_paged_fast", "radix_topk"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# the scoring kernel's (BLOCK_N, num_warps, num_stages); benchmarks/kernels.py sweeps others
SCORE_TILE = (128, 4, 3)


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@triton.jit
def _score_kernel(
    q_ptr, w_ptr, pool_ptr, bt_ptr, lens_ptr, trow_ptr, out_ptr, row0, max_keys, keys_per_prog, scale,
    s_qt, s_qh, s_wt, s_bt, s_ot,
    HI: tl.constexpr, HI_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TROW: tl.constexpr, IEEE: tl.constexpr,
    STAGES: tl.constexpr,
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
    if IEEE:
        cdt = tl.float32
    else:
        cdt = tl.bfloat16
    offs_h = tl.arange(0, HI_PAD)
    offs_d = tl.arange(0, D_PAD)
    hmask = offs_h < HI
    dmask = offs_d < D
    q = tl.load(
        q_ptr + t.to(tl.int64) * s_qt + offs_h[:, None] * s_qh + offs_d[None, :],
        mask=hmask[:, None] & dmask[None, :], other=0.0,
    ).to(cdt)  # fmt: skip
    w = tl.load(w_ptr + t.to(tl.int64) * s_wt + offs_h, mask=hmask, other=0.0).to(tl.float32)
    orow = out_ptr + local.to(tl.int64) * s_ot
    for start in tl.range(lo, vis, BLOCK_N, num_stages=STAGES):
        offs_n = start + tl.arange(0, BLOCK_N)
        valid = offs_n < vis
        blk = tl.load(bt_ptr + trow * s_bt + offs_n // PAGE, mask=valid, other=0).to(tl.int64)
        row = blk * PAGE + offs_n % PAGE
        k = tl.load(
            pool_ptr + row[:, None] * D + offs_d[None, :], mask=valid[:, None] & dmask[None, :], other=0.0
        )
        if IEEE:
            s = tl.dot(q, tl.trans(k.to(cdt)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k.to(cdt)))
        s = tl.maximum(s * scale, 0.0) * w[:, None]
        tl.store(orow + offs_n, tl.where(valid, tl.sum(s, 0), float("-inf")), mask=offs_n < hi)


@triton.jit
def _ordered_key(x):
    """fp32 -> int64 in [0, 2^32), increasing with the float (the radix select's key)."""
    b = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b + 2147483648, -b - 1)


@triton.jit
def _topk_kernel(
    s_ptr, lens_ptr, out_ptr, row0, max_keys, k, s_st, s_ot,
    BLOCK: tl.constexpr,
):  # fmt: skip
    local = tl.program_id(0)
    t = row0 + local
    n = tl.minimum(tl.load(lens_ptr + t).to(tl.int32), max_keys)
    srow = s_ptr + local.to(tl.int64) * s_st
    orow = out_ptr + t.to(tl.int64) * s_ot
    if n <= k:  # every visible key, then -1
        for start in range(0, k, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(orow + offs, tl.where(offs < n, offs, -1).to(tl.int64), mask=offs < k)
    else:
        # 512 bins: digits 0-255 of the keys still in the running, 256 for the others (dropped)
        bins = tl.arange(0, 512)
        real = bins < 256
        prefix = tl.zeros([1], tl.int64)  # the high digits chosen so far
        want = k  # keys still to take among those matching `prefix`
        for p in tl.static_range(4):  # digit p: key bits 24 - 8p .. 31 - 8p
            hist = tl.zeros([512], tl.int32)
            for start in range(0, n, BLOCK):
                offs = start + tl.arange(0, BLOCK)
                m = offs < n
                key = _ordered_key(tl.load(srow + offs, mask=m, other=0.0))
                match = m & ((key >> (32 - 8 * p)) == (prefix >> (32 - 8 * p)))
                digit = tl.where(match, (key >> (24 - 8 * p)) & 255, 256).to(tl.int32)
                hist += tl.histogram(digit, 512)
            hist = tl.where(real, hist, 0)
            above = tl.sum(hist, 0) - tl.cumsum(hist, 0)  # keys with a larger digit
            # the digit of the k-th largest: the largest d with (count >= d) >= want
            d = tl.max(tl.where(real & (above + hist >= want), bins, -1), 0)
            want -= tl.sum(tl.where(bins == d, above, 0), 0)
            prefix = prefix | (d.to(tl.int64) << (24 - 8 * p))
        # the threshold key is `prefix`; take every larger key and the first `want` equal ones
        written = n * 0  # int32 tensors (a literal 0 or `k`, specialised to 1, would be constexprs)
        eq_seen = n * 0
        for start in range(0, n, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            m = offs < n
            key = _ordered_key(tl.load(srow + offs, mask=m, other=0.0))
            gt = m & (key > prefix)
            eq = m & (key == prefix)
            eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), 0)
            sel = gt | (eq & (eq_rank <= want))
            pos = written + tl.cumsum(sel.to(tl.int32), 0) - 1
            tl.store(orow + pos, offs.to(tl.int64), mask=sel)
            written += tl.sum(sel.to(tl.int32), 0)
            eq_seen += tl.sum(eq.to(tl.int32), 0)


def dsa_topk_paged_fast(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    topk: int,
    table_rows: Tensor | None = None,
    score_tile: tuple[int, int, int] | None = None,
) -> Tensor:
    """Same contract as `dsa_topk_paged_reference`; `score_tile` overrides `SCORE_TILE`."""
    t, hi, d = q_index.shape
    page = index_pool.shape[1]
    max_keys = block_tables.shape[1] * page
    k = selected_count(topk, max_keys)
    # every entry is written by `_topk_kernel` (the selection, then -1 for rows with < k keys)
    out = torch.empty((t, k), dtype=torch.long, device=q_index.device)
    if t == 0:
        return out
    q_index = q_index.contiguous()
    weights = weights.contiguous()
    block_tables = block_tables.contiguous()
    trow = table_rows.contiguous() if table_rows is not None else seq_lens
    ieee = index_pool.dtype == torch.float32 or _INTERPRET
    block_n, warps, stages = score_tile or SCORE_TILE
    if _INTERPRET:
        block_n = 16
    step = max(1, min(t, SCORE_BUDGET // max_keys))
    scores = torch.empty(step, max_keys, dtype=torch.float32, device=q_index.device)
    # tiles per program: about four programs per SM in all (shape-only, so graph-safe)
    sms = _sm_count(q_index.device.index or 0) if q_index.is_cuda else 4
    tiles = triton.cdiv(max_keys, block_n)
    keys_per_prog = block_n * max(1, triton.cdiv(step * tiles, 4 * sms))
    for r0 in range(0, t, step):
        rows = min(step, t - r0)
        _score_kernel[(rows, triton.cdiv(max_keys, keys_per_prog))](
            q_index, weights, index_pool, block_tables, seq_lens, trow, scores, r0, max_keys,
            keys_per_prog, d**-0.5, q_index.stride(0), q_index.stride(1), weights.stride(0),
            block_tables.stride(0), scores.stride(0),
            HI=hi, HI_PAD=max(16, triton.next_power_of_2(hi)), D=d, D_PAD=max(16, triton.next_power_of_2(d)),
            PAGE=page, BLOCK_N=block_n, HAS_TROW=table_rows is not None, IEEE=ieee, STAGES=stages,
            num_warps=warps,
        )  # fmt: skip
        _launch_topk(scores, seq_lens, out, r0, rows, max_keys, k)
    return out


def _launch_topk(
    scores: Tensor, lens: Tensor, out: Tensor, r0: int, rows: int, max_keys: int, k: int
) -> None:
    _topk_kernel[(rows,)](
        scores, lens, out, r0, max_keys, k, scores.stride(0), out.stride(0),
        BLOCK=64 if _INTERPRET else 2048, num_warps=8,
    )  # fmt: skip


def radix_topk(scores: Tensor, lens: Tensor, k: int) -> Tensor:
    """`[T, k]` int64: per row the positions of the `k` largest of `scores[t, :lens[t]]` in
    ascending order (ties at the k-th value: the lowest positions), `-1`-padded when
    `lens[t] < k`. `scores` `[T, S]` fp32 (no NaN in the visible part)."""
    t, s = scores.shape
    out = torch.empty((t, k), dtype=torch.long, device=scores.device)
    if t:
        _launch_topk(scores.contiguous(), lens.contiguous(), out, 0, t, s, k)
    return out

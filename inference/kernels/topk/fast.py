"""Exact top-k positions per row in Triton: a four-level radix select spread over many programs.

Scores map to order-preserving 32-bit keys; four passes over the row's scores build per-chunk
histograms of the keys' next 8-bit digit among the keys still matching the digits chosen so
far; after each pass one program per row picks the digit that holds the k-th largest key.
After the last pass the threshold key `T` and the number of ties to take at `T` are
known, and one more pass writes every key above `T` plus the first ties (lowest positions), in
ascending position order, each chunk at the offset given by the chunk counts kept per level.

Why this shape: the selection is a handful of full-bandwidth passes over a `[rows, S]` fp32 score
array (16 MB at batch 32 x 128K, mostly still in L2 after scoring) by a few programs per SM, no
sort and no atomics (so the output is deterministic). `torch.topk` measured 119 us at batch 32 x
128K, k 2048 on the H200; an earlier radix select with one program per row 936 us (32 programs
cannot fill 132 SMs).
"""

# ruff: noqa: SIM102  (a constexpr `if` around a runtime `if`: Triton folds the outer one away)

from __future__ import annotations

import functools
import os
from typing import Literal

import torch
import triton
import triton.language as tl
from torch import Tensor

from inference.kernels.topk import compact

__all__ = ["compact_rows", "select_rows", "topk_positions_fast"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# bins per level: four 8-bit digits cover the 32-bit key. Not fewer, wider levels: Triton's
# histogram costs each warp ~log2(bins) ops per owned bin per 32 keys, so 2048 bins (three levels
# of 11, 11, 10 bits) measured 602 us at batch 32 x 128K on the H200 (torch.topk: 124 us)
NBINS = 256
_LEVELS = ((24, 8), (16, 8), (8, 8), (0, 8))  # (shift, bits) from the top digit down
# keys one program handles per loop iteration, and programs per SM the chunking aims at
_BLOCK = 64 if _INTERPRET else 1024
_PROGRAMS_PER_SM = 4
# the compact path's one pass over the scores: more, shorter programs (a load and a dependent
# atomic per block, so memory parallelism comes from programs in flight)
_COMPACT_PROGRAMS_PER_SM = 16
_FIND_CHUNKS = 4 if _INTERPRET else 16  # chunk histograms the per-row find step reads per load


@functools.cache
def _sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@triton.jit
def _ordered_key(x):
    """fp32 -> int64 in [0, 2^32), increasing with the float; -0.0 and +0.0 share one key (they
    compare equal, as `torch.topk` treats them)."""
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.where(b >= 0, b + 2147483648, -b - 1)


@triton.jit
def _hist_kernel(
    s_ptr, lens_ptr, state_ptr, hist_ptr, done_ptr, row0, max_keys, chunk, s_st,
    LEVEL: tl.constexpr, SHIFT: tl.constexpr, BITS: tl.constexpr, NB: tl.constexpr, BLOCK: tl.constexpr,
    HAS_DONE: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    if HAS_DONE:
        if tl.load(done_ptr + r) != 0:  # selected by the compact path (compact.py)
            return
    chunks = tl.num_programs(1)
    n = tl.minimum(tl.load(lens_ptr + row0 + r).to(tl.int32), max_keys)
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n)
    prefix = tl.load(state_ptr + 2 * r) if LEVEL > 0 else 0
    srow = s_ptr + r.to(tl.int64) * s_st
    hist = tl.zeros([NB], tl.int32)
    zeros = 0
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < hi
        key = _ordered_key(tl.load(srow + offs, mask=m, other=0.0))
        if LEVEL > 0:
            m = m & ((key >> (SHIFT + BITS)) == (prefix >> (SHIFT + BITS)))
        digit = tl.where(m, (key >> SHIFT) & ((1 << BITS) - 1), 0).to(tl.int32)
        # keys out of the running land in bin 0; bin 0 is then recounted from the matching keys
        # alone (no histogram mask argument in every Triton release the device may have)
        hist += tl.histogram(digit, NB)
        zeros += tl.sum((m & (digit == 0)).to(tl.int32), 0)
    bins = tl.arange(0, NB)
    hist = tl.where(bins == 0, zeros, hist)
    tl.store(hist_ptr + (r * chunks + c).to(tl.int64) * NB + bins, hist)


@triton.jit
def _find_kernel(
    hist_ptr, state_ptr, gt_ptr, ties_ptr, lens_ptr, krows_ptr, done_ptr, row0, max_keys, width, chunks,
    LEVEL: tl.constexpr, SHIFT: tl.constexpr, LAST: tl.constexpr, NB: tl.constexpr, HAS_K: tl.constexpr,
    CB: tl.constexpr, HAS_DONE: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    if HAS_DONE:
        if tl.load(done_ptr + r) != 0:
            return
    bins = tl.arange(0, NB)
    offs_c = tl.arange(0, CB)
    if LEVEL == 0:
        n = tl.minimum(tl.load(lens_ptr + row0 + r).to(tl.int64), max_keys)
        k = width.to(tl.int64)
        if HAS_K:
            k = tl.maximum(tl.minimum(tl.load(krows_ptr + row0 + r).to(tl.int64), k), 0)
        want = tl.minimum(k, n)
        prefix = tl.zeros([], tl.int64)
    else:
        prefix = tl.load(state_ptr + 2 * r)
        want = tl.load(state_ptr + 2 * r + 1)
    base = hist_ptr + (r * chunks).to(tl.int64) * NB
    # `CB` chunks' histograms per load: one row alone over a long context has hundreds of chunks,
    # and a loop of one dependent load per chunk was most of a batch-1 DSA decode step at 1M
    total = tl.zeros([NB], tl.int32)
    for c0 in range(0, chunks, CB):
        cm = (c0 + offs_c) < chunks
        total += tl.sum(
            tl.load(base + (c0 + offs_c)[:, None] * NB + bins[None, :], mask=cm[:, None], other=0), 0
        )
    above = tl.sum(total, 0) - tl.cumsum(total, 0)  # matching keys with a larger digit
    # the digit of the want-th largest matching key (bin 0 always qualifies: its sum is all keys)
    d = tl.max(tl.where(above + total >= want, bins, -1), 0)
    want = want - tl.sum(tl.where(bins == d, above, 0), 0).to(tl.int64)
    tl.store(state_ptr + 2 * r, prefix | (d.to(tl.int64) << SHIFT))
    tl.store(state_ptr + 2 * r + 1, want)
    # per chunk: keys decided above the threshold at this level (and at the last, the ties)
    for c0 in range(0, chunks, CB):
        cs = c0 + offs_c
        cm = cs < chunks
        hc = tl.load(base + cs[:, None] * NB + bins[None, :], mask=cm[:, None], other=0)
        g = tl.sum(tl.where(bins[None, :] > d, hc, 0), 1)
        if LEVEL > 0:
            g += tl.load(gt_ptr + r * chunks + cs, mask=cm, other=0)
        tl.store(gt_ptr + r * chunks + cs, g, mask=cm)
        if LAST:
            tl.store(ties_ptr + r * chunks + cs, tl.sum(tl.where(bins[None, :] == d, hc, 0), 1), mask=cm)


@triton.jit
def _gather_kernel(
    s_ptr, lens_ptr, state_ptr, gt_ptr, ties_ptr, out_ptr, done_ptr, row0, max_keys, width, chunk, s_st, s_ot,
    BLOCK: tl.constexpr, CH_PAD: tl.constexpr, HAS_DONE: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    if HAS_DONE:
        if tl.load(done_ptr + r) != 0:
            return
    chunks = tl.num_programs(1)
    n = tl.minimum(tl.load(lens_ptr + row0 + r).to(tl.int32), max_keys)
    thr = tl.load(state_ptr + 2 * r)
    want = tl.load(state_ptr + 2 * r + 1).to(tl.int32)
    offs_c = tl.arange(0, CH_PAD)
    cm = offs_c < chunks
    gt = tl.load(gt_ptr + r * chunks + offs_c, mask=cm, other=0)
    ties = tl.load(ties_ptr + r * chunks + offs_c, mask=cm, other=0)
    ties_before = tl.cumsum(ties, 0) - ties
    taken = gt + tl.minimum(tl.maximum(want - ties_before, 0), ties)
    written = tl.sum(tl.where(offs_c < c, taken, 0), 0)
    eq_seen = tl.sum(tl.where(offs_c < c, ties, 0), 0)
    srow = s_ptr + r.to(tl.int64) * s_st
    orow = out_ptr + (row0 + r).to(tl.int64) * s_ot
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < hi
        key = _ordered_key(tl.load(srow + offs, mask=m, other=0.0))
        above = m & (key > thr)
        eq = m & (key == thr)
        eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), 0)  # 1-based rank among the row's ties
        sel = above | (eq & (eq_rank <= want))
        pos = written + tl.cumsum(sel.to(tl.int32), 0) - 1
        tl.store(orow + pos, offs.to(tl.int64), mask=sel)
        written += tl.sum(sel.to(tl.int32), 0)
        eq_seen += tl.sum(eq.to(tl.int32), 0)
    if c == 0:  # the unused tail of the row
        count = tl.sum(taken, 0)
        for start in range(0, width, BLOCK):
            offs = start + tl.arange(0, BLOCK)
            tl.store(orow + offs, tl.full([BLOCK], -1, tl.int64), mask=(offs >= count) & (offs < width))


def _chunking(rows: int, keys: int, device: torch.device, per_sm: int = _PROGRAMS_PER_SM) -> tuple[int, int]:
    """(keys per program, programs per row): about `per_sm` programs per SM in all (shape-only, so
    a CUDA graph replays the same launch)."""
    sms = _sm_count(device.index or 0) if device.type == "cuda" else 4
    blocks = triton.cdiv(keys, _BLOCK)
    per = max(1, triton.cdiv(rows * blocks, per_sm * sms))
    chunk = _BLOCK * min(per, blocks)
    return chunk, triton.cdiv(keys, chunk)


def _radix_rows(
    scores: Tensor, lens: Tensor, out: Tensor, row0: int, k_rows: Tensor | None, done: Tensor | None = None
) -> None:
    """The radix select of `select_rows`; with `done` (`[rows]` int32) only the rows where it is 0
    (the compact path's fallback), on a chunking planned for a share of the rows."""
    rows, keys = scores.shape
    width = out.shape[1]
    dev = scores.device
    plan = rows if done is None else compact.fallback_plan_rows(rows)
    chunk, chunks = _chunking(plan, keys, dev)
    hist = torch.empty(rows * chunks * NBINS, dtype=torch.int32, device=dev)
    state = torch.empty(rows, 2, dtype=torch.int64, device=dev)
    gt = torch.empty(rows, chunks, dtype=torch.int32, device=dev)
    ties = torch.empty(rows, chunks, dtype=torch.int32, device=dev)
    krows = k_rows if k_rows is not None else lens
    dn = done if done is not None else lens  # never read without HAS_DONE
    warps = 1 if _INTERPRET else 4
    for level, (shift, bits) in enumerate(_LEVELS):
        _hist_kernel[(rows, chunks)](
            scores, lens, state, hist, dn, row0, keys, chunk, scores.stride(0),
            LEVEL=level, SHIFT=shift, BITS=bits, NB=NBINS, BLOCK=_BLOCK, HAS_DONE=done is not None,
            num_warps=warps,
        )  # fmt: skip
        _find_kernel[(rows,)](
            hist, state, gt, ties, lens, krows, dn, row0, keys, width, chunks,
            LEVEL=level, SHIFT=shift, LAST=level == len(_LEVELS) - 1, NB=NBINS,
            HAS_K=k_rows is not None, CB=_FIND_CHUNKS, HAS_DONE=done is not None, num_warps=warps,
        )  # fmt: skip
    _gather_kernel[(rows, chunks)](
        scores, lens, state, gt, ties, out, dn, row0, keys, width, chunk, scores.stride(0), out.stride(0),
        BLOCK=_BLOCK, CH_PAD=max(2, triton.next_power_of_2(chunks)), HAS_DONE=done is not None,
        num_warps=warps,
    )  # fmt: skip


def compact_rows(
    scores: Tensor, lens: Tensor, out: Tensor, row0: int, k_rows: Tensor | None = None
) -> Tensor:
    """The compact path of `select_rows` without its radix fallback: `done` `[rows]` int32, 1 where
    it wrote the row's selection (tests, and benchmarks counting the fallback's rows)."""
    chunk, chunks = _chunking(scores.shape[0], scores.shape[1], scores.device, _COMPACT_PROGRAMS_PER_SM)
    return compact.compact_select(scores, lens, out, row0, k_rows, chunk, chunks)


def select_rows(
    scores: Tensor,
    lens: Tensor,
    out: Tensor,
    row0: int,
    k_rows: Tensor | None = None,
    *,
    method: Literal["auto", "radix", "compact"] = "auto",
) -> None:
    """Fill `out[row0 : row0 + scores.shape[0]]` (`[T, width]` int64) with the selection of the
    score rows `scores` `[rows, S]` fp32; `lens`/`k_rows` are indexed like `out` (contract in
    `topk_positions_reference`). `method`: "auto" follows `compact.use_compact`; "radix" or
    "compact" (with the radix fallback) force a path, for A/B timing and tests."""
    rows, keys = scores.shape
    if rows == 0:
        return
    if method == "auto":
        method = "compact" if compact.use_compact(rows, keys, out.shape[1]) else "radix"
    if method == "radix":
        _radix_rows(scores, lens, out, row0, k_rows)
    elif method == "compact":
        _radix_rows(scores, lens, out, row0, k_rows, compact_rows(scores, lens, out, row0, k_rows))
    else:
        raise ValueError(f"method must be auto, radix or compact, got {method!r}")


def topk_positions_fast(
    scores: Tensor,
    lens: Tensor,
    width: int,
    k_rows: Tensor | None = None,
    *,
    method: Literal["auto", "radix", "compact"] = "auto",
) -> Tensor:
    """Same contract as `topk_positions_reference`; `method` as in `select_rows`."""
    out = torch.empty(scores.shape[0], width, dtype=torch.long, device=scores.device)
    k = k_rows.contiguous() if k_rows is not None else None
    select_rows(scores.float().contiguous(), lens.contiguous(), out, 0, k, method=method)
    return out

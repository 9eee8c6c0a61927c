"""Exact top-k positions for blocks of many long rows: a guessed threshold, one compacting pass, a
per-row exact selection among the few candidates, and the radix select (`fast.py`) for the rows
where the guess failed.

1. Guess (a program per row): from `SAMPLE_SEGS` evenly spread runs of `SAMPLE_SEG` contiguous
   visible scores, the threshold key `T` at the sample rank that puts the row's expected count of
   keys >= `T` at `sqrt(k * CAP)` (the geometric middle of the `[k, CAP]` window it must land in:
   equal margins in log terms, which is where the relative error of a rank estimate lives). Rows of
   at most `CAP` visible keys take the lowest key, so every visible key is a candidate.
2. Compact (programs = rows x chunks): every key >= `T` goes, as (key, position), to its row's
   `[CAP]` candidate buffer at a slot claimed from the row's cursor with one atomic per block of
   keys; slots past `CAP` are dropped but still counted.
3. Select (a program per row): when `min(k, n) <= count <= CAP` the k-th largest candidate is
   found exactly (a binary search over the key, then over the position among ties at that key:
   ties go to the lowest positions), the chosen positions are sorted ascending and written with
   the `-1` tail, and `done[r] = 1`; otherwise `done[r] = 0`.
4. The radix kernels then run with `done`: each program of a done row returns at once, so no host
   synchronisation is needed (this may run inside CUDA-graph capture).

Atomics only decide the order of a row's candidates; the selection is a function of their set, so
the output is deterministic and identical to `topk_positions_reference`.

Why: the radix select reads every score five times and is compute-bound (four 8-bit histograms
over int64 keys; 39.8 ms for an 8K-query chunk over 128K keys on an H100). Here a score is read
once by a cheap compare, and only a few thousand candidates per row are looked at again.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["CAP", "compact_select", "fallback_plan_rows", "use_compact"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# candidate slots per row; small under the interpreter so that tests reach the fallback and the
# multi-chunk compaction with small shapes
CAP = 128 if _INTERPRET else 8192
# the sample: SAMPLE_SEGS runs of SAMPLE_SEG contiguous scores (8 fp32 = one 32-byte sector, so
# the sample costs no wasted bandwidth); at most CAP samples, so a sampled row (n > CAP) has
# runs that never overlap
SAMPLE_SEGS = 8 if _INTERPRET else 1024
SAMPLE_SEG = 4 if _INTERPRET else 8
_BLOCK = 64 if _INTERPRET else 1024  # keys per compaction loop step (one atomic each)
# which share of a block's rows the fallback's chunking is sized for: a few failed rows then run
# on many programs each (the radix kernels' wave time scales with keys per program), while the
# done rows' programs, which return at once, stay few
_FALLBACK_SHARE = 16
_MIN_ROWS = 64
# whether `select_rows(method="auto")` takes this path at all (a switch for A/B runs). On an H100,
# 8K DSA prefill queries (`python -m benchmarks.dsa_v32 --parts prefill_split`): 19.0 vs 40.0 ms
# for the radix select at 128K keys, 73.6 vs 239.8 ms at 1M, >= 99.99% of rows without fallback
AUTO_COMPACT = True
# the select step holds 2 x CAP int32 per program and sorts CAP: 16 warps keep that at ~100
# registers a thread with no spills (8 warps: ~185); either way one program per SM
_SELECT_WARPS = 16
assert SAMPLE_SEGS * SAMPLE_SEG <= CAP


def use_compact(rows: int, keys: int, width: int) -> bool:
    """The one dispatch rule between this path and the radix select.

    Compact (with `AUTO_COMPACT` on) when the block has `_MIN_ROWS` rows or more (DSA
    prefill's blocks: 64 rows at 1M keys up to 2048 at 32K, where the radix select is
    compute-bound), rows of at least `4 CAP`
    keys (shorter rows are cheap for the radix path, and candidates would be a large share of the
    row) and `k <= CAP / 4` (room for the guess's margin on both sides of `sqrt(k CAP)`). Decode
    (a few rows) keeps the tuned radix path."""
    return AUTO_COMPACT and rows >= _MIN_ROWS and keys >= 4 * CAP and 4 * width <= CAP


def fallback_plan_rows(rows: int) -> int:
    """Rows the radix fallback's chunking is planned for (see `_FALLBACK_SHARE`)."""
    return max(1, rows // _FALLBACK_SHARE)


@triton.jit
def _key32(x):
    """fp32 -> int32 whose signed order is the float order; -0.0 and +0.0 share one key."""
    x = tl.where(x == 0.0, 0.0, x)
    b = x.to(tl.int32, bitcast=True)
    return tl.where(b >= 0, b, b ^ 0x7FFFFFFF)


@triton.jit
def _row_want(lens_ptr, krows_ptr, row0, r, max_keys, width, HAS_K: tl.constexpr):
    """(visible keys, keys to select) of row `r` of the block."""
    n = tl.minimum(tl.load(lens_ptr + row0 + r).to(tl.int32), max_keys)
    n = tl.maximum(n, 0)
    k = width
    if HAS_K:
        k = tl.maximum(tl.minimum(tl.load(krows_ptr + row0 + r).to(tl.int32), width), 0)
    return n, tl.minimum(k, n)


@triton.jit
def _kth_largest(x, valid, m, lo, hi):
    """The m-th largest of the int32 `x[valid]` (m >= 1, at least m valid, all within [lo, hi]):
    the largest t with count(x >= t) >= m, by bisection of [lo, hi] (midpoints floored by a shift:
    int64 `//` truncates toward zero). A loop of reductions: no sort of the values needed."""
    lo = lo.to(tl.int64)
    hi = hi.to(tl.int64) + 1  # count(x >= hi) < m
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        good = tl.sum((valid & (x >= mid)).to(tl.int32), 0) >= m
        lo = tl.where(good, mid, lo)
        hi = tl.where(good, hi, mid)
    return lo.to(tl.int32)


@triton.jit
def _guess_kernel(
    s_ptr, lens_ptr, krows_ptr, thr_ptr, cursor_ptr, row0, max_keys, width, s_st,
    HAS_K: tl.constexpr, CAP_: tl.constexpr, SEGS: tl.constexpr, SEG: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    n, want = _row_want(lens_ptr, krows_ptr, row0, r, max_keys, width, HAS_K)
    tl.store(cursor_ptr + r, 0)  # the compaction pass counts from here
    thr = tl.full([], -(2**31), tl.int32)
    if n > CAP_:
        # run starts spread evenly over [0, n - SEG]
        seg = tl.arange(0, SEGS).to(tl.int64)
        start = seg * (n - SEG).to(tl.int64) // (SEGS - 1)
        offs = start[:, None] + tl.arange(0, SEG)[None, :]
        srow = s_ptr + r.to(tl.int64) * s_st
        key = _key32(tl.load(srow + offs))
        # sample rank of the threshold: the expected count sqrt(want CAP) scaled to the sample
        target = tl.sqrt(tl.maximum(want, 1).to(tl.float32) * CAP_)
        m = tl.ceil(target * (SEGS * SEG) / n.to(tl.float32)).to(tl.int32)
        m = tl.minimum(tl.maximum(m, 1), SEGS * SEG)
        key = tl.reshape(key, [SEGS * SEG])
        thr = _kth_largest(key, key == key, m, tl.min(key, 0), tl.max(key, 0))
    tl.store(thr_ptr + r, thr)


@triton.jit
def _compact_kernel(
    s_ptr, lens_ptr, thr_ptr, cursor_ptr, ckey_ptr, cpos_ptr, row0, max_keys, chunk, s_st,
    CAP_: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    c = tl.program_id(1)
    n = tl.minimum(tl.load(lens_ptr + row0 + r).to(tl.int32), max_keys)
    thr = tl.load(thr_ptr + r)
    srow = s_ptr + r.to(tl.int64) * s_st
    crow = r.to(tl.int64) * CAP_
    lo = c * chunk
    hi = tl.minimum(lo + chunk, n)
    for start in range(lo, hi, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        m = offs < hi
        key = _key32(tl.load(srow + offs, mask=m, other=0.0))
        sel = m & (key >= thr)
        # one slot claim per block; only atomicity matters (the select step reads after the kernel)
        base = tl.atomic_add(cursor_ptr + r, tl.sum(sel.to(tl.int32), 0), sem="relaxed")
        slot = base + tl.cumsum(sel.to(tl.int32), 0) - 1
        ok = sel & (slot < CAP_)
        tl.store(ckey_ptr + crow + slot, key, mask=ok)
        tl.store(cpos_ptr + crow + slot, offs, mask=ok)


@triton.jit
def _select_kernel(
    ckey_ptr, cpos_ptr, thr_ptr, cursor_ptr, lens_ptr, krows_ptr, done_ptr, out_ptr, row0, max_keys, width, s_ot,
    HAS_K: tl.constexpr, CAP_: tl.constexpr, TAIL: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0)
    _n, want = _row_want(lens_ptr, krows_ptr, row0, r, max_keys, width, HAS_K)
    count = tl.load(cursor_ptr + r)
    ok = (want == 0) | ((count >= want) & (count <= CAP_))
    tl.store(done_ptr + r, ok.to(tl.int32))
    if ok:
        idx = tl.arange(0, CAP_)
        valid = idx < count
        crow = r.to(tl.int64) * CAP_
        key = tl.load(ckey_ptr + crow + idx, mask=valid, other=0)
        pos = tl.load(cpos_ptr + crow + idx, mask=valid, other=0)
        # the want-th largest candidate (want >= 1; want == 0 selects nothing): its key tk, then
        # among the ties at tk the lowest positions up to `plast` (a search only when more keys tie
        # than are still wanted, rare with continuous scores)
        kmin = tl.load(thr_ptr + r)  # every candidate is >= the guess
        kmax = tl.max(tl.where(valid, key, -(2**31)), 0)
        tk = _kth_largest(key, valid, tl.maximum(want, 1), kmin, kmax)
        tk = tl.where(want > 0, tk, 2**31 - 1)
        eq = valid & (key == tk)
        need = want - tl.sum((valid & (key > tk)).to(tl.int32), 0)
        plast = tl.full([], 2**31 - 1, tl.int32)
        if tl.sum(eq.to(tl.int32), 0) > need:
            # the smallest p with count(eq & pos <= p) >= need: the need-th smallest tied position,
            # i.e. the (neq - need + 1)-th largest
            neq = tl.sum(eq.to(tl.int32), 0)
            pmin = tl.min(tl.where(eq, pos, 2**31 - 1), 0)
            pmax = tl.max(tl.where(eq, pos, -1), 0)
            plast = _kth_largest(pos, eq, neq - need + 1, pmin, pmax)
        sel = valid & ((key > tk) | (eq & (pos <= plast)))
        spos = tl.sort(tl.where(sel, pos, 2**31 - 1))  # the chosen positions first, ascending
        orow = out_ptr + (row0 + r).to(tl.int64) * s_ot
        tl.store(orow + idx, tl.where(idx < want, spos, -1).to(tl.int64), mask=idx < width)
        for start in range(CAP_, width, TAIL):  # width > CAP: the rest of the -1 tail
            offs = start + tl.arange(0, TAIL)
            tl.store(orow + offs, tl.full([TAIL], -1, tl.int64), mask=offs < width)


def compact_select(
    scores: Tensor, lens: Tensor, out: Tensor, row0: int, k_rows: Tensor | None, chunk: int, chunks: int
) -> Tensor:
    """Steps 1-3 for the score rows `scores` `[rows, S]` into `out[row0 : row0 + rows]` (arguments as
    `fast.select_rows`; `chunk`/`chunks` split each row for the compaction pass). Returns `done`
    `[rows]` int32: 1 where the row's output is written, 0 where the radix select must run."""
    rows, keys = scores.shape
    width = out.shape[1]
    dev = scores.device
    thr = torch.empty(rows, dtype=torch.int32, device=dev)
    cursor = torch.empty(rows, dtype=torch.int32, device=dev)  # zeroed by the guess kernel
    ckey = torch.empty(rows, CAP, dtype=torch.int32, device=dev)
    cpos = torch.empty(rows, CAP, dtype=torch.int32, device=dev)
    done = torch.empty(rows, dtype=torch.int32, device=dev)
    krows = k_rows if k_rows is not None else lens
    _guess_kernel[(rows,)](
        scores, lens, krows, thr, cursor, row0, keys, width, scores.stride(0),
        HAS_K=k_rows is not None, CAP_=CAP, SEGS=SAMPLE_SEGS, SEG=SAMPLE_SEG, num_warps=1 if _INTERPRET else 8,
    )  # fmt: skip
    _compact_kernel[(rows, chunks)](
        scores, lens, thr, cursor, ckey, cpos, row0, keys, chunk, scores.stride(0),
        CAP_=CAP, BLOCK=_BLOCK, num_warps=1 if _INTERPRET else 4,
    )  # fmt: skip
    _select_kernel[(rows,)](
        ckey, cpos, thr, cursor, lens, krows, done, out, row0, keys, width, out.stride(0),
        HAS_K=k_rows is not None, CAP_=CAP, TAIL=_BLOCK, num_warps=1 if _INTERPRET else _SELECT_WARPS,
    )  # fmt: skip
    return done

"""Triton grouped GEMMs of the routed experts at decode sizes (contracts in `reference.py`).

At batch 1 the cutlass grouped GEMM (`torch._grouped_mm`) took ~14.6 us per call on the H200 for
~1 us of expert weights (two calls per MoE layer), and the SwiGLU between them a third kernel.
Here each program owns one expert and one block of output columns: it reads that weight tile
once per 16 of the expert's rows (at decode an expert has a few rows, so once) against the rows
gathered straight from the token matrix, and the up kernel applies SwiGLU to its fp32 gate and up
sums before its only store. Experts that got no rows end at once. Only for `P <= MAX_PAIRS`:
above it (prefill) the cutlass kernel's large tiles win.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = [
    "CANDIDATE_TILES",
    "DOWN_TILES",
    "MAX_PAIRS",
    "UP_TILES",
    "moe_down_fast",
    "moe_up_fast",
    "pick_tile",
]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
MAX_PAIRS = 512  # b128 x top-4; a group then holds ~16 rows (one row tile) at 32 experts
BLOCK_M = 16  # rows per tile (tl.dot's minimum)
BLOCK_K = 128  # the same in every tile: each output's K sum runs in one order whatever the tile
# (most pairs, (BLOCK_N, num_warps, num_stages)), by the step's pairs (tokens x top-k), from
# `benchmarks/kernels.py --sections moe` on the H200 (12 tiles each; graph replay, L2 flushed; %
# of the 4.25 TB/s copy bandwidth on the routed experts' weights). Batch 1: up 14.3 us (41%; the
# one tile before: 19.2 us), down 10.2 us (29%); narrower column blocks, more programs, were
# slower (16 columns: 17-24 us). Batch 4: 26.7 / 17.3 us (78 / 60%). Batch 32 / 128: up 50.0 /
# 78.2 us (89 / 61%), down 27.6 / 35.9 us (81 / 66%; before: 27.6 / 42.8).
# the tiles the sweep times and the `gpu` test checks bit for bit against each other
CANDIDATE_TILES = tuple((bn, w, st) for bn in (16, 32, 64) for w, st in ((2, 4), (4, 3), (4, 4), (4, 5)))
UP_TILES = ((8, (64, 4, 5)), (32, (64, 4, 3)), (MAX_PAIRS, (32, 4, 5)))
DOWN_TILES = ((8, (64, 2, 4)), (32, (32, 4, 3)), (MAX_PAIRS, (64, 2, 4)))


def pick_tile(tiles: tuple[tuple[int, tuple[int, int, int]], ...], pairs: int) -> tuple[int, int, int]:
    """The tile of the first row of `tiles` whose bound holds `pairs`."""
    return next(t for most, t in tiles if pairs <= most)


@triton.jit
def _group_rows(ENDS, e):
    """Expert `e`'s rows of the sorted pairs: `[ends[e-1], ends[e])`."""
    return tl.load(ENDS + e - 1, mask=e > 0, other=0), tl.load(ENDS + e)


@triton.jit
def _moe_up_kernel(
    X, TOK, W, ENDS, OUT, stride_x, stride_we, stride_wn, stride_o, H, INTER,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    # fp32 (and the interpreter, whose dot takes no bf16) use exact fp32 dots; bf16 stays bf16
    e = tl.program_id(0)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < INTER
    start, end = _group_rows(ENDS, e)
    for m0 in range(start, end, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        mmask = ms < end
        rows = tl.load(TOK + ms, mask=mmask, other=0)
        gate = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, H, BLOCK_K, num_stages=STAGES):  # nested: pipelined only when asked
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < H
            a = tl.load(X + rows[:, None] * stride_x + ks[None, :], mask=mmask[:, None] & kmask[None, :],
                        other=0.0)  # fmt: skip
            # weight tiles [BLOCK_N, BLOCK_K], contiguous along K (vector loads), used transposed
            wmask = nmask[:, None] & kmask[None, :]
            wg = tl.load(W + e * stride_we + ns[:, None] * stride_wn + ks[None, :], mask=wmask, other=0.0)
            wu = tl.load(W + e * stride_we + (INTER + ns[:, None]) * stride_wn + ks[None, :], mask=wmask,
                         other=0.0)  # fmt: skip
            if IEEE:
                a, wg, wu = a.to(tl.float32), wg.to(tl.float32), wu.to(tl.float32)
                gate = tl.dot(a, tl.trans(wg), gate, input_precision="ieee")
                up = tl.dot(a, tl.trans(wu), up, input_precision="ieee")
            else:
                gate = tl.dot(a, tl.trans(wg), gate)
                up = tl.dot(a, tl.trans(wu), up)
        act = gate / (1.0 + tl.exp(-gate)) * up
        tl.store(OUT + ms[:, None] * stride_o + ns[None, :], act.to(OUT.dtype.element_ty),
                 mask=mmask[:, None] & nmask[None, :])  # fmt: skip


@triton.jit
def _moe_down_kernel(
    A, W, ENDS, OUT, stride_a, stride_we, stride_wn, stride_o, N, K,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, IEEE: tl.constexpr, STAGES: tl.constexpr,
):  # fmt: skip
    e = tl.program_id(0)
    ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = ns < N
    start, end = _group_rows(ENDS, e)
    for m0 in range(start, end, BLOCK_M):
        ms = m0 + tl.arange(0, BLOCK_M)
        mmask = ms < end
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=STAGES):
            ks = k0 + tl.arange(0, BLOCK_K)
            kmask = ks < K
            a = tl.load(A + ms[:, None] * stride_a + ks[None, :], mask=mmask[:, None] & kmask[None, :],
                        other=0.0)  # fmt: skip
            w = tl.load(W + e * stride_we + ns[:, None] * stride_wn + ks[None, :],
                        mask=nmask[:, None] & kmask[None, :], other=0.0)  # fmt: skip
            if IEEE:
                acc = tl.dot(a.to(tl.float32), tl.trans(w.to(tl.float32)), acc, input_precision="ieee")
            else:
                acc = tl.dot(a, tl.trans(w), acc)
        tl.store(OUT + ms[:, None] * stride_o + ns[None, :], acc.to(OUT.dtype.element_ty),
                 mask=mmask[:, None] & nmask[None, :])  # fmt: skip


def _ieee(t: Tensor) -> bool:
    return t.dtype == torch.float32 or _INTERPRET


def _fit(tile: tuple[int, int, int], t: Tensor) -> tuple[int, int, int]:
    """The tile as launched for `t`'s dtype: the tables are picked for bf16, and an fp32 tile
    takes twice the shared memory per stage (Triton keeps `num_stages - 1` buffers: fp32 (64, 4, 5)
    asked for 4 x 73,728 B = 294,912 B on the H200, whose limit is 232,448), so fp32 keeps <= 4."""
    bn, warps, stages = tile
    return (bn, warps, min(stages, 4)) if t.dtype == torch.float32 else tile


def _check(name: str, rows: int, w: Tensor, ends: Tensor) -> None:
    if rows > MAX_PAIRS:
        raise ValueError(f"{name}: at most {MAX_PAIRS} pairs, got {rows}: use torch._grouped_mm")
    if w.dim() != 3 or w.stride(-1) != 1 or ends.shape != (w.shape[0],) or ends.dtype != torch.int32:
        raise ValueError(f"{name}: need weights [E, N, K] with unit stride in K and ends [E] int32, got "
                         f"{tuple(w.shape)} and {tuple(ends.shape)} {ends.dtype}")  # fmt: skip


def moe_up_fast(
    x: Tensor, tok: Tensor, w13: Tensor, ends: Tensor, tile: tuple[int, int, int] | None = None
) -> Tensor:
    """`moe_up_reference`'s contract (gate|up GEMM + SwiGLU) in one kernel; `tile` (BLOCK_N,
    num_warps, num_stages) overrides `UP_TILES`' pick."""
    p, (e, two_i, h) = tok.shape[0], w13.shape
    _check("moe_up", p, w13, ends)
    if x.shape[1] != h or x.stride(-1) != 1 or two_i % 2:
        raise ValueError(
            f"moe_up: x {tuple(x.shape)} against w13 {tuple(w13.shape)}: need x [T, H], w13 [E, 2I, H]"
        )
    i = two_i // 2
    out = torch.empty(p, i, dtype=x.dtype, device=x.device)
    if p:
        bn, warps, stages = _fit(tile or pick_tile(UP_TILES, p), x)
        _moe_up_kernel[(e, triton.cdiv(i, bn))](
            x, tok, w13, ends, out, x.stride(0), w13.stride(0), w13.stride(1), out.stride(0), h, i,
            BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_K=BLOCK_K, IEEE=_ieee(x), STAGES=stages, num_warps=warps,
        )  # fmt: skip
    return out


def moe_down_fast(act: Tensor, w2: Tensor, ends: Tensor, tile: tuple[int, int, int] | None = None) -> Tensor:
    """`moe_down_reference`'s contract in one kernel; `tile` overrides `DOWN_TILES`' pick."""
    p, (e, h, i) = act.shape[0], w2.shape
    _check("moe_down", p, w2, ends)
    if act.shape[1] != i or act.stride(-1) != 1:
        raise ValueError(f"moe_down: act {tuple(act.shape)} against w2 {tuple(w2.shape)}: need act [P, I]")
    out = torch.empty(p, h, dtype=act.dtype, device=act.device)
    if p:
        bn, warps, stages = _fit(tile or pick_tile(DOWN_TILES, p), act)
        _moe_down_kernel[(e, triton.cdiv(h, bn))](
            act, w2, ends, out, act.stride(0), w2.stride(0), w2.stride(1), out.stride(0), h, i,
            BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_K=BLOCK_K, IEEE=_ieee(act), STAGES=stages, num_warps=warps,
        )  # fmt: skip
    return out

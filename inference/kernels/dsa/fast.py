"""Triton lightning-indexer scores over the paged indexer-key cache, then top-k.

One program scores `BLOCK_N` keys of one query row for all indexer heads at once (one tensor-core
dot `[Hi, D] x [D, BLOCK_N]`), applies ReLU and the per-head weights and sums the heads in
registers: only the `[rows, S]` head-summed scores reach HBM (never `[rows, Hi, S]`), and rows
go in blocks of at most `SCORE_BUDGET` scores, so a long prefill never holds its full `[L, S]`
score matrix. `torch.topk` picks the keys of each block.
"""

# ruff: noqa: SIM108  (constexpr branches inside @triton.jit stay `if` statements, as Triton lowers them)

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl
from torch import Tensor

from inference.kernels.dsa.reference import SCORE_BUDGET, selected_count

__all__ = ["dsa_topk_paged_fast"]

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


@triton.jit
def _score_kernel(
    q_ptr, w_ptr, pool_ptr, bt_ptr, lens_ptr, trow_ptr, out_ptr, row0, max_keys, scale,
    s_qt, s_qh, s_wt, s_bt, s_ot,
    HI: tl.constexpr, HI_PAD: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
    PAGE: tl.constexpr, BLOCK_N: tl.constexpr, HAS_TROW: tl.constexpr, IEEE: tl.constexpr,
):  # fmt: skip
    local = tl.program_id(0)
    nb = tl.program_id(1)
    t = row0 + local
    seq_len = tl.load(lens_ptr + t).to(tl.int32)
    if HAS_TROW:
        trow = tl.load(trow_ptr + t).to(tl.int64)
    else:
        trow = t.to(tl.int64)
    offs_n = nb * BLOCK_N + tl.arange(0, BLOCK_N)
    valid = offs_n < seq_len
    score = tl.full([BLOCK_N], float("-inf"), tl.float32)
    if nb * BLOCK_N < seq_len:
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
        score = tl.where(valid, tl.sum(s, 0), float("-inf"))
    tl.store(out_ptr + local.to(tl.int64) * s_ot + offs_n, score, mask=offs_n < max_keys)


def dsa_topk_paged_fast(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    topk: int,
    table_rows: Tensor | None = None,
) -> Tensor:
    """Same contract as `dsa_topk_paged_reference`."""
    t, hi, d = q_index.shape
    page = index_pool.shape[1]
    max_keys = block_tables.shape[1] * page
    k = selected_count(topk, max_keys)
    out = torch.full((t, k), -1, dtype=torch.long, device=q_index.device)
    if t == 0:
        return out
    q_index = q_index.contiguous()
    weights = weights.contiguous()
    block_tables = block_tables.contiguous()
    trow = table_rows.contiguous() if table_rows is not None else seq_lens
    ieee = index_pool.dtype == torch.float32 or _INTERPRET
    block_n = 16 if _INTERPRET else 128
    step = max(1, min(t, SCORE_BUDGET // max_keys))
    scores = torch.empty(step, max_keys, dtype=torch.float32, device=q_index.device)
    for r0 in range(0, t, step):
        rows = min(step, t - r0)
        _score_kernel[(rows, triton.cdiv(max_keys, block_n))](
            q_index, weights, index_pool, block_tables, seq_lens, trow, scores, r0, max_keys,
            d**-0.5, q_index.stride(0), q_index.stride(1), weights.stride(0), block_tables.stride(0),
            scores.stride(0),
            HI=hi, HI_PAD=max(16, triton.next_power_of_2(hi)), D=d, D_PAD=max(16, triton.next_power_of_2(d)),
            PAGE=page, BLOCK_N=block_n, HAS_TROW=table_rows is not None, IEEE=ieee,
            num_warps=4,
        )  # fmt: skip
        vals, idx = scores[:rows].topk(k, dim=-1)
        out[r0 : r0 + rows] = torch.where(torch.isfinite(vals), idx, -1)
    return out

"""fp32 PyTorch reference of the DSA lightning indexer's top-k over a paged indexer-key cache."""

from __future__ import annotations

import torch
from torch import Tensor

from inference.kernels.fp8 import quantize_rows_fp8
from inference.kernels.mla_decode.reference import paged_rows
from inference.kernels.topk.reference import topk_positions_reference

__all__ = ["dsa_scores_reference", "dsa_topk_paged_reference", "selected_count"]

# scores held at once: rows per block * keys <= this (bounds memory for long contexts)
SCORE_BUDGET = 1 << 26


def selected_count(topk: int, max_keys: int) -> int:
    """Width of the index tensor: `min(topk, max_keys)`, fixed by shapes (graph-safe)."""
    return max(1, min(topk, max_keys))


def dsa_scores_reference(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    tables: Tensor,
    seq_lens: Tensor,
    index_scales: Tensor | None = None,
) -> Tensor:
    """`[T, W * block_size]` fp32 indexer scores of every key position of each row's block-table
    row `tables[t]` (`-inf` at positions `>= seq_lens[t]`). FP8 keys are dequantised by their
    scales and the queries go through e4m3 too (one scale per row and head, as the kernel's fp8
    tensor-core dot takes them), so both paths score the same numbers."""
    page = index_pool.shape[1]
    max_keys = tables.shape[1] * page
    pos = torch.arange(max_keys, device=q_index.device).expand(q_index.shape[0], max_keys)
    rows = paged_rows(tables, pos, page)
    blk, slot = rows // page, rows % page  # (block, slot) indexing: the pool may be a strided view
    keys = index_pool[blk, slot].float()  # [T, S, D]
    if index_scales is not None:
        keys = keys * index_scales[blk, slot][..., None]
    q = q_index.float()
    if index_scales is not None:
        q8, q_scale = quantize_rows_fp8(q.reshape(-1, q.shape[-1]))
        q = (q8.float() * q_scale[:, None]).view(q.shape)
    scale = q_index.shape[-1] ** -0.5
    per_head = torch.relu(torch.einsum("thd,tsd->ths", q, keys) * scale)
    score = torch.einsum("th,ths->ts", weights.float(), per_head)
    return score.masked_fill(pos >= seq_lens.to(q_index.device).long()[:, None], float("-inf"))


def dsa_topk_paged_reference(
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
) -> Tensor:
    """The `topk` highest-scoring visible keys of each query row, as key positions.

    `score[t, s] = sum_h weights[t, h] * relu(q_index[t, h] . k[s] / sqrt(D))` over the keys
    `s < seq_lens[t]` of the row's sequence (its block-table row `table_rows[t]`, default `t`).

    Args:
        q_index: `[T, Hi, D]` indexer queries; weights: `[T, Hi]` (already scaled by `Hi**-0.5`).
        index_pool: `[num_blocks, block_size, D]` indexer keys of one layer (a view whose blocks
            may be strided: the FP8 cache keeps each block's scales after its keys).
        block_tables: `[B, W]` block ids; seq_lens: `[T]` keys each row may see.
        topk: keys kept per row.
        table_rows: optional `[T]` block-table row of each query row.
        index_scales: `[num_blocks, block_size]` fp32 dequantisation scales of FP8 keys.
        topk_rows: optional `[T]` keys kept per row (each at most `topk`).
    Returns:
        `[T, k]` int64 positions in ascending order, `k = selected_count(topk, W * block_size)`;
        a row that keeps fewer than `k` keys has `-1` in its unused entries (so `k >= context`
        selects all keys). Ties at the k-th score go to the lowest positions.
    """
    t = q_index.shape[0]
    tables = block_tables if table_rows is None else block_tables[table_rows.long()]
    max_keys = tables.shape[1] * index_pool.shape[1]
    k = selected_count(topk, max_keys)
    out = torch.full((t, k), -1, dtype=torch.long, device=q_index.device)
    lens = seq_lens.to(q_index.device).long()
    step = max(1, SCORE_BUDGET // (max_keys * q_index.shape[1]))
    for r0 in range(0, t, step):
        r1 = min(r0 + step, t)
        score = dsa_scores_reference(
            q_index[r0:r1], weights[r0:r1], index_pool, tables[r0:r1], lens[r0:r1], index_scales
        )
        krows = None if topk_rows is None else topk_rows[r0:r1]
        out[r0:r1] = topk_positions_reference(score, lens[r0:r1], k, krows)
    return out

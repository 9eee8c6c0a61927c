"""fp32 PyTorch reference of the DSA lightning indexer's top-k over a paged indexer-key cache."""

from __future__ import annotations

import torch
from torch import Tensor

from inference.kernels.mla_decode.reference import paged_rows

__all__ = ["dsa_topk_paged_reference", "selected_count"]

# scores held at once: rows per block * keys <= this (bounds memory for long contexts)
SCORE_BUDGET = 1 << 26


def selected_count(topk: int, max_keys: int) -> int:
    """Width of the index tensor: `min(topk, max_keys)`, fixed by shapes (graph-safe)."""
    return max(1, min(topk, max_keys))


def dsa_topk_paged_reference(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    topk: int,
    table_rows: Tensor | None = None,
) -> Tensor:
    """The `topk` highest-scoring visible keys of each query row, as key positions.

    `score[t, s] = sum_h weights[t, h] * relu(q_index[t, h] . k[s] / sqrt(D))` over the keys
    `s < seq_lens[t]` of the row's sequence (its block-table row `table_rows[t]`, default `t`).

    Args:
        q_index: `[T, Hi, D]` indexer queries; weights: `[T, Hi]` (already scaled by `Hi**-0.5`).
        index_pool: `[num_blocks, block_size, D]` indexer keys of one layer.
        block_tables: `[B, W]` block ids; seq_lens: `[T]` keys each row may see.
        topk: keys kept per row.
        table_rows: optional `[T]` block-table row of each query row.
    Returns:
        `[T, k]` int64 positions, `k = selected_count(topk, W * block_size)`; a row that sees
        fewer than `k` keys has `-1` in its unused entries (so `k >= context` selects all keys).
    """
    t = q_index.shape[0]
    page = index_pool.shape[1]
    tables = block_tables if table_rows is None else block_tables[table_rows.long()]
    max_keys = tables.shape[1] * page
    k = selected_count(topk, max_keys)
    out = torch.full((t, k), -1, dtype=torch.long, device=q_index.device)
    scale = q_index.shape[-1] ** -0.5
    flat = index_pool.view(-1, index_pool.shape[-1])
    lens = seq_lens.to(q_index.device).long()
    step = max(1, SCORE_BUDGET // (max_keys * q_index.shape[1]))
    for r0 in range(0, t, step):
        r1 = min(r0 + step, t)
        pos = torch.arange(max_keys, device=q_index.device).expand(r1 - r0, max_keys)
        keys = flat[paged_rows(tables[r0:r1], pos, page)].float()  # [rows, S, D]
        per_head = torch.relu(torch.einsum("thd,tsd->ths", q_index[r0:r1].float(), keys) * scale)
        score = torch.einsum("th,ths->ts", weights[r0:r1].float(), per_head)
        visible = pos < lens[r0:r1, None]
        score = score.masked_fill(~visible, float("-inf"))
        vals, idx = score.topk(k, dim=-1)
        out[r0:r1] = torch.where(torch.isfinite(vals), idx, -1)
    return out

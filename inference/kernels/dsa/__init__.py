"""DSA: lightning-indexer top-k over the paged indexer keys (bf16/fp32, or FP8 with per-key scales;
the selection is `inference.kernels.topk`). The sparse attention over the chosen keys is
`inference.kernels.mla_decode.mla_decode_paged` with `indices`."""

from __future__ import annotations

import torch
from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.dsa.reference import dsa_topk_paged_reference, selected_count

__all__ = ["PREFILL_ROWS", "dsa_topk_paged", "dsa_topk_paged_reference", "selected_count"]

# query rows of one sequence scored per key-tile read in prefill (`dsa_scores_fast`: 1, 2 or 4),
# by key dtype. H200 sweep of benchmarks/kernels.py (`dsa_prefill`, 8K queries over 128K keys,
# scoring alone, 1 / 2 / 4 rows): bf16 keys 60.2 / 40.2 / 49.7 ms, FP8 keys 30.6 / 27.9 / 22.7 ms
PREFILL_ROWS = {"bf16": 2, "fp8": 4}


def dsa_topk_paged(
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
    prefill: bool = False,
) -> Tensor:
    """`[T, k]` selected key positions (`-1` = unused); contract in `dsa_topk_paged_reference`.
    `prefill`: the rows are prefill queries, in runs that share a sequence (`table_rows`): the fast
    path scores `PREFILL_ROWS[dtype]` of them per key-tile read (the result does not change)."""
    if q_index.dim() != 3 or weights.shape != q_index.shape[:2]:
        raise ValueError(f"need q_index [T, Hi, D] and weights [T, Hi], got {q_index.shape}, {weights.shape}")
    if index_pool.dim() != 3 or index_pool.shape[-1] != q_index.shape[-1]:
        raise ValueError(
            f"index_pool must be [blocks, block_size, {q_index.shape[-1]}], got {index_pool.shape}"
        )
    if seq_lens.shape != q_index.shape[:1]:
        raise ValueError(f"seq_lens must be [{q_index.shape[0]}], got {tuple(seq_lens.shape)}")
    if topk <= 0:
        raise ValueError(f"topk must be positive, got {topk}")
    if (index_scales is not None) != (index_pool.dtype == torch.float8_e4m3fn):
        raise ValueError("FP8 indexer keys need their index_scales (and only FP8 keys have them)")
    if index_scales is not None and index_scales.shape != index_pool.shape[:2]:
        raise ValueError(
            f"index_scales must be {tuple(index_pool.shape[:2])}, got {tuple(index_scales.shape)}"
        )
    if topk_rows is not None and topk_rows.shape != seq_lens.shape:
        raise ValueError(f"topk_rows must be [{seq_lens.shape[0]}], got {tuple(topk_rows.shape)}")
    kw = dict(topk=topk, table_rows=table_rows, index_scales=index_scales, topk_rows=topk_rows)
    if use_fast(index_pool):
        from inference.kernels.dsa.fast import dsa_topk_paged_fast

        group = PREFILL_ROWS["fp8" if index_scales is not None else "bf16"] if prefill else 1
        return dsa_topk_paged_fast(
            q_index, weights, index_pool, block_tables, seq_lens, rows_per_program=group, **kw
        )
    return dsa_topk_paged_reference(q_index, weights, index_pool, block_tables, seq_lens, **kw)

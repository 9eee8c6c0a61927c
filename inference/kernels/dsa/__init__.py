"""DSA: lightning-indexer top-k over the paged indexer keys (the sparse attention over the chosen
keys is `inference.kernels.mla_decode.mla_decode_paged` with `indices`)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.dsa.reference import dsa_topk_paged_reference, selected_count

__all__ = ["dsa_topk_paged", "dsa_topk_paged_reference", "selected_count"]


def dsa_topk_paged(
    q_index: Tensor,
    weights: Tensor,
    index_pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    topk: int,
    table_rows: Tensor | None = None,
) -> Tensor:
    """`[T, k]` selected key positions (`-1` = unused); contract in `dsa_topk_paged_reference`."""
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
    kw = dict(topk=topk, table_rows=table_rows)
    if use_fast(index_pool):
        from inference.kernels.dsa.fast import dsa_topk_paged_fast

        return dsa_topk_paged_fast(q_index, weights, index_pool, block_tables, seq_lens, **kw)
    return dsa_topk_paged_reference(q_index, weights, index_pool, block_tables, seq_lens, **kw)

"""Paged MLA decode: split-KV absorbed attention over block tables (bf16/fp32 or fp8 latents)."""

from __future__ import annotations

from torch import Tensor

from inference.kernels import use_fast
from inference.kernels.mla_decode.reference import mla_decode_paged_reference

__all__ = ["mla_decode_paged", "mla_decode_paged_reference"]


def mla_decode_paged(
    q_latent: Tensor,
    q_rope: Tensor,
    pool: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    *,
    kv_lora_rank: int,
    scale: float,
    kv_scales: Tensor | None = None,
    indices: Tensor | None = None,
    table_rows: Tensor | None = None,
    num_splits: int | None = None,
) -> Tensor:
    """`[N, H, R]` fp32 latent-space attention output; contract in `mla_decode_paged_reference`."""
    if q_latent.dim() != 3 or q_latent.shape[-1] != kv_lora_rank:
        raise ValueError(f"q_latent must be [N, H, {kv_lora_rank}], got {tuple(q_latent.shape)}")
    if pool.dim() != 3 or pool.shape[-1] < kv_lora_rank:
        raise ValueError(f"pool must be [blocks, block_size, R + P], got {tuple(pool.shape)}")
    rows = q_latent.shape[0]
    if seq_lens.shape != (rows,):
        raise ValueError(f"seq_lens must be [{rows}], got {tuple(seq_lens.shape)}")
    if indices is not None and (indices.dim() != 2 or indices.shape[0] != rows):
        raise ValueError(f"indices must be [{rows}, K], got {tuple(indices.shape)}")
    if table_rows is None and block_tables.shape[0] != rows:
        raise ValueError(f"block_tables has {block_tables.shape[0]} rows for {rows} queries")
    kw = dict(kv_lora_rank=kv_lora_rank, scale=scale, kv_scales=kv_scales, indices=indices,
              table_rows=table_rows, num_splits=num_splits)  # fmt: skip
    if use_fast(pool):
        from inference.kernels.mla_decode.fast import mla_decode_paged_fast, rows_aligned

        if rows_aligned(pool) or not pool.is_cuda:  # unaligned rows (tiny test models): reference
            return mla_decode_paged_fast(q_latent, q_rope, pool, block_tables, seq_lens, **kw)
    return mla_decode_paged_reference(q_latent, q_rope, pool, block_tables, seq_lens, **kw)

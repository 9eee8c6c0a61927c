"""fp32 PyTorch reference of paged, absorbed MLA decode (the Triton kernel's oracle and CPU path)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["mla_decode_paged_reference"]


def paged_rows(block_tables: Tensor, positions: Tensor, block_size: int) -> Tensor:
    """Flat pool rows of token `positions` `[N, K]` of each sequence (clamped into the table)."""
    width = block_tables.shape[1]
    pos = positions.clamp(min=0).long()
    blk = torch.gather(block_tables.long(), 1, (pos // block_size).clamp(max=width - 1))
    return blk * block_size + pos % block_size


def mla_decode_paged_reference(
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
    """Attention of one query row per entry over its sequence's paged latents, in latent space.

    `score[n, h, s] = scale * (q_latent[n, h] . c[s] + q_rope[n, h] . k_rope[s])` over the keys
    `s < seq_lens[n]` (or, with `indices`, over the listed positions `0 <= s < seq_lens[n]`),
    `out[n, h] = softmax(score) @ c`. Up-projecting with `W_UV` is the caller's.

    Args:
        q_latent: `[N, H, R]` queries absorbed into latent space (`q_nope @ W_UK`).
        q_rope: `[N, H, P]` rope part of the queries (`P = 0` allowed).
        pool: `[num_blocks, block_size, R + P]` one layer's latent cache (bf16/fp32, or
            float8_e4m3fn with `kv_scales`).
        block_tables: `[B, W]` block ids per sequence.
        seq_lens: `[N]` keys visible to each row (a row with 0 keys gets zeros).
        kv_lora_rank: `R`.
        scale: softmax scale.
        kv_scales: `[num_blocks, block_size]` fp32 dequantisation scale of each cached row (fp8).
        indices: optional `[N, K]` int key positions per row (DSA top-k); `< 0` entries are unused.
        table_rows: optional `[N]` block-table row of each query row (default: row `n` uses `n`).
        num_splits: ignored (the kernel's split-KV factor; the result does not depend on it).
    Returns:
        `[N, H, R]` fp32.
    """
    del num_splits
    r = kv_lora_rank
    n = q_latent.shape[0]
    tables = block_tables if table_rows is None else block_tables[table_rows.long()]
    block_size = pool.shape[1]
    if indices is None:
        width = tables.shape[1] * block_size
        positions = torch.arange(width, device=pool.device).expand(n, width)
    else:
        positions = indices.to(pool.device).long()
    rows = paged_rows(tables, positions, block_size)  # [N, K]
    flat = pool.view(-1, pool.shape[-1])
    lat = flat[rows].float()  # [N, K, R + P]
    if kv_scales is not None:
        lat = lat * kv_scales.reshape(-1)[rows].float()[..., None]
    c, kr = lat[..., :r], lat[..., r:]
    scores = torch.einsum("nhr,nkr->nhk", q_latent.float(), c)
    if kr.shape[-1]:
        scores = scores + torch.einsum("nhp,nkp->nhk", q_rope.float(), kr)
    valid = (positions >= 0) & (positions < seq_lens.to(pool.device).long()[:, None])
    scores = (scores * scale).masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # a row with no keys: zeros
    return torch.einsum("nhk,nkr->nhr", probs, c)

"""Grouped-query softmax attention over a paged K|V cache (Qwen3-Next's full-attention layers).

Cache layout of one layer: `pool [num_blocks, block_size, 2 * num_kv_heads * head_dim]`, each
token's row holding its K (all kv heads) followed by its V, in the model dtype. Written at
`slot_mapping` like the MLA latent, so the block pool, prefix cache and checkpoint rule are the
same bookkeeping.

Reference implementation in PyTorch (fp32 softmax), one sequence at a time; a paged flash kernel
plugs in behind `gqa_paged_attention`'s signature.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gqa_paged_attention", "gqa_write_kv"]


def gather_paged(pool: Tensor, block_tables: Tensor, lengths: list[int] | tuple[int, ...]) -> Tensor:
    """Each sequence's first `lengths[i]` rows of a `[num_blocks, block_size, D]` paged pool, as
    `[N, max(lengths), D]` (rows past a sequence's length are unspecified)."""
    block_size = pool.shape[1]
    pos = torch.arange(max(lengths), device=pool.device)
    blk_idx = (pos // block_size).clamp(max=block_tables.shape[1] - 1)
    blocks = block_tables.to(device=pool.device, dtype=torch.long)[:, blk_idx]  # [N, S]
    return pool[blocks, (pos % block_size)[None, :].expand_as(blocks)]


def gqa_write_kv(pool: Tensor, slot_mapping: Tensor, k: Tensor, v: Tensor) -> None:
    """Store `k, v [T, Hkv, D]` at the flat `slot_mapping [T]` rows of `pool` (in place)."""
    t = k.shape[0]
    if v.shape != k.shape or pool.shape[-1] != 2 * k[0].numel():
        raise ValueError(f"k/v {tuple(k.shape)}/{tuple(v.shape)} do not fit a pool row of {pool.shape[-1]}")
    rows = torch.cat([k.reshape(t, -1), v.reshape(t, -1)], dim=-1).to(pool.dtype)
    pool.view(-1, pool.shape[-1]).index_copy_(0, slot_mapping.to(pool.device), rows)


def gqa_paged_attention(
    q: Tensor,
    pool: Tensor,
    block_tables: Tensor,
    *,
    query_lens: tuple[int, ...],
    context_lens: tuple[int, ...],
    num_kv_heads: int,
    scale: float,
) -> Tensor:
    """Causal attention of each sequence's new queries over its cached keys.

    Args:
        q: `[T, H, D]` queries of all sequences, flattened in batch order (rope applied).
        pool: the layer's paged K|V cache, already holding this step's keys.
        block_tables: `[N, max_blocks]` block ids per sequence.
        query_lens, context_lens: host lengths: new tokens and tokens cached before them.
        num_kv_heads: `Hkv`, dividing `H`; query head `h` reads kv head `h // (H // Hkv)`.
        scale: softmax scale.
    Returns:
        `[T, H, D]` in `q.dtype`.
    """
    t, h, d = q.shape
    if h % num_kv_heads or pool.shape[-1] != 2 * num_kv_heads * d:
        raise ValueError(
            f"{h} query heads / {num_kv_heads} kv heads of dim {d} vs pool width {pool.shape[-1]}"
        )
    if len(query_lens) != len(context_lens) or sum(query_lens) != t:
        raise ValueError(f"query_lens {query_lens} do not cover {t} tokens")
    out = torch.empty_like(q)
    start = 0
    for i, (n, ctx) in enumerate(zip(query_lens, context_lens, strict=True)):
        s = ctx + n
        kv = gather_paged(pool, block_tables[i : i + 1], [s])[0].float()  # [S, 2*Hkv*D]
        k, v = (
            x.view(s, num_kv_heads, d).repeat_interleave(h // num_kv_heads, dim=1) for x in kv.chunk(2, -1)
        )
        scores = torch.einsum("nhd,shd->hns", q[start : start + n].float(), k) * scale
        # query j (absolute position ctx + j) sees keys 0..ctx + j
        future = torch.arange(s, device=q.device)[None, :] > (ctx + torch.arange(n, device=q.device))[:, None]
        probs = scores.masked_fill(future[None], float("-inf")).softmax(dim=-1)
        out[start : start + n] = torch.einsum("hns,shd->nhd", probs, v).to(q.dtype)
        start += n
    return out

"""MLA and DSA attention ops over the paged latent cache (fp32-accurate PyTorch references).

These are the seams for our own Triton kernels (paged MLA decode, DSA top-k sparse attention):
a kernel replaces one function here and keeps its signature.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = [
    "dsa_topk_indices",
    "gather_paged",
    "mla_decode_absorbed",
    "mla_prefill_attention",
    "topk_to_mask",
]


def gather_paged(pool: Tensor, block_tables: Tensor, lengths: list[int] | tuple[int, ...]) -> Tensor:
    """Read each sequence's first `lengths[i]` cached rows into a padded dense tensor.

    Args:
        pool: `[num_blocks, block_size, D]` paged cache of one layer.
        block_tables: `[N, max_blocks]` int block ids.
        lengths: host lengths, one per sequence.
    Returns:
        `[N, max(lengths), D]`; rows past a sequence's length are unspecified (mask them).
    """
    block_size = pool.shape[1]
    s_max = max(lengths)
    pos = torch.arange(s_max, device=pool.device)
    nblk = block_tables.shape[1]
    blk_idx = (pos // block_size).clamp(max=nblk - 1)
    blocks = block_tables.to(device=pool.device, dtype=torch.long)[:, blk_idx]  # [N, S]
    return pool[blocks, (pos % block_size)[None, :].expand_as(blocks)]


def mla_prefill_attention(
    q: Tensor, k: Tensor, v: Tensor, context_len: int, scale: float, allowed: Tensor | None = None
) -> Tensor:
    """Causal attention of `L` new queries over `S = context_len + L` expanded keys of one sequence.

    Args:
        q: `[L, H, Dqk]`; k: `[S, H, Dqk]`; v: `[S, H, Dv]`.
        context_len: tokens cached before the new ones (query `i` sits at `context_len + i`).
        scale: softmax scale.
        allowed: optional `[L, S]` bool, keys a query may see besides causality (DSA selection).
    Returns:
        `[L, H, Dv]` in `q.dtype`.
    """
    length, s = q.shape[0], k.shape[0]
    qpos = torch.arange(length, device=q.device)[:, None] + context_len
    mask = torch.arange(s, device=q.device)[None, :] <= qpos  # [L, S]
    if allowed is not None:
        mask = mask & allowed
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask[None], scale=scale
    )
    return out.transpose(0, 1)


def mla_decode_absorbed(
    q_latent: Tensor,
    q_rope: Tensor,
    latents: Tensor,
    lengths: Tensor,
    w_uv: Tensor,
    kv_lora_rank: int,
    scale: float,
    allowed: Tensor | None = None,
) -> Tensor:
    """One-query-per-sequence MLA in absorbed form: attend over the latent cache, then expand.

    `q_latent = q_nope @ W_UK` (per head) is computed by the caller, so keys never get expanded:
    `score = q_latent . c + q_rope . k_rope`, `out = (softmax . c) @ W_UV^T`.

    Args:
        q_latent: `[N, H, R]`; q_rope: `[N, H, P]`.
        latents: `[N, S, R + P]` padded cached latents (`gather_paged`).
        lengths: `[N]` valid rows per sequence (the query is the last of them).
        w_uv: `[H, Dv, R]` value up-projection.
        kv_lora_rank: `R`.
        scale: softmax scale.
        allowed: optional `[N, S]` bool extra mask (DSA selection).
    Returns:
        `[N, H, Dv]` in `q_latent.dtype`.
    """
    c = latents[..., :kv_lora_rank].float()
    kr = latents[..., kv_lora_rank:].float()
    scores = torch.einsum("nhr,nsr->nhs", q_latent.float(), c)
    if kr.shape[-1]:
        scores = scores + torch.einsum("nhp,nsp->nhs", q_rope.float(), kr)
    valid = (
        torch.arange(latents.shape[1], device=latents.device)[None, :] < lengths.to(latents.device)[:, None]
    )
    if allowed is not None:
        valid = valid & allowed
    scores = (scores * scale).masked_fill(~valid[:, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o_lat = torch.einsum("nhs,nsr->nhr", probs, c)
    return torch.einsum("nhr,hvr->nhv", o_lat, w_uv.float()).to(q_latent.dtype)


def dsa_topk_indices(
    q_index: Tensor, k_index: Tensor, weights: Tensor, context_len: int, topk: int
) -> tuple[Tensor, Tensor]:
    """Lightning-indexer selection: the `topk` highest-scoring visible keys of each query.

    `score[l, s] = sum_h weights[l, h] * relu(q_index[l, h] . k_index[s] / sqrt(D))` over the
    causally visible keys `s <= context_len + l`.

    Args:
        q_index: `[L, Hi, D]`; k_index: `[S, D]`; weights: `[L, Hi]` (already scaled by `Hi**-0.5`).
        context_len: tokens cached before the `L` queries.
        topk: keys kept per query.
    Returns:
        `(indices [L, k] int64, valid [L, k] bool)` with `k = min(topk, S)`; invalid entries
        (a query that sees fewer than `k` keys) point at masked keys and must be ignored.
    """
    length, s = q_index.shape[0], k_index.shape[0]
    scale = q_index.shape[-1] ** -0.5
    per_head = torch.relu(torch.einsum("lhd,sd->lhs", q_index.float(), k_index.float()) * scale)
    score = torch.einsum("lh,lhs->ls", weights.float(), per_head)
    qpos = torch.arange(length, device=q_index.device)[:, None] + context_len
    visible = torch.arange(s, device=q_index.device)[None, :] <= qpos
    score = score.masked_fill(~visible, float("-inf"))
    vals, idx = score.topk(min(topk, s), dim=-1)
    return idx, torch.isfinite(vals)


def topk_to_mask(indices: Tensor, valid: Tensor, num_keys: int) -> Tensor:
    """Scatter `dsa_topk_indices` output into an `[L, num_keys]` bool mask of selected keys."""
    mask = torch.zeros(indices.shape[0], num_keys, dtype=torch.bool, device=indices.device)
    return mask.scatter(1, indices, valid)

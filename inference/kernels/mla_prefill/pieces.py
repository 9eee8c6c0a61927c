"""One sequence's causal MLA prefill with its keys expanded a piece at a time.

A prefill chunk's keys split into the cached prefix (every query sees all of it: non-causal
attention, in pieces of fixed length) and the chunk itself (a square causal block); the parts are
merged by their log-sum-exp. Each part is computed from keys the caller expands for that range
only, so a chunk over 1M keys of 128 heads (64 GiB expanded) holds one piece's keys, not all.
`part` is cuDNN on CUDA (`fast._cudnn`) and `attention_lse_reference` (fp32) elsewhere.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

__all__ = ["attention_lse_reference", "merge_by_lse", "prefill_by_pieces", "prefix_pieces"]

# (q [1, H, L, Dqk], k [1, H, S, Dqk], v [1, H, S, Dv], causal, scale) -> (out, natural-log LSE [1, H, L])
Part = Callable[[Tensor, Tensor, Tensor, bool, float], tuple[Tensor, Tensor]]


def prefix_pieces(ctx: int, piece: int) -> list[tuple[int, int]]:
    """Key ranges `[a, b)` covering the cached prefix `[0, ctx)`, cut at multiples of `piece`."""
    return [(a, min(a + piece, ctx)) for a in range(0, ctx, piece)]


def merge_by_lse(parts: list[tuple[Tensor, Tensor]]) -> Tensor:
    """Attention outputs over disjoint key sets, each with its natural-log LSE (`[..., L, Dv]`,
    `[..., L]`), merged into the attention over their union (fp32)."""
    total = torch.logsumexp(torch.stack([lse for _, lse in parts]), dim=0)
    out = torch.zeros(parts[0][0].shape, dtype=torch.float32, device=parts[0][0].device)
    for o, lse in parts:
        out.addcmul_(o, torch.exp(lse - total)[..., None])
    return out


def attention_lse_reference(
    q: Tensor, k: Tensor, v: Tensor, causal: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """fp32 attention `[1, H, L, D]` -> (out `[1, H, L, Dv]`, LSE `[1, H, L]`); `causal`: top-left
    (query `i` sees keys `<= i`), as cuDNN's `is_causal` for the square diagonal block."""
    s = torch.einsum("bhld,bhsd->bhls", q.float(), k.float()) * scale
    if causal:
        keep = torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    return torch.einsum("bhls,bhsv->bhlv", torch.exp(s - lse[..., None]), v.float()), lse


def prefill_by_pieces(
    q: Tensor,
    keys: Callable[[int, int], tuple[Tensor, Tensor]],
    num_keys: int,
    *,
    scale: float,
    piece: int,
    part: Part = attention_lse_reference,
) -> Tensor:
    """Causal attention of one sequence's `L` new tokens over its `num_keys` keys (the new ones
    last), the prefix `piece` keys at a time, merged as it goes (one piece's output held at once).

    Args:
        q: `[1, H, L, Dqk]` queries.
        keys: `keys(a, b)` -> (k `[1, H, b - a, Dqk]`, v `[1, H, b - a, Dv]`) of positions `[a, b)`.
        num_keys: `S >= L`.
    Returns:
        `[1, H, L, Dv]` fp32.
    """
    ctx = num_keys - q.shape[2]
    if ctx < 0:
        raise ValueError(f"{q.shape[2]} queries need at least as many keys, got {num_keys}")
    out, lse = part(q, *keys(ctx, num_keys), True, scale)
    out = out.float()
    for a, b in prefix_pieces(ctx, piece):
        o, l2 = part(q, *keys(a, b), False, scale)
        total = torch.logaddexp(lse, l2)
        out.mul_(torch.exp(lse - total)[..., None]).addcmul_(o, torch.exp(l2 - total)[..., None])
        lse = total
    return out

"""fp32 PyTorch reference of the exact top-k selection the DSA indexer uses (`fast.py` beside it)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["topk_positions_reference"]


def topk_positions_reference(
    scores: Tensor, lens: Tensor, width: int, k_rows: Tensor | None = None
) -> Tensor:
    """Per row the positions of its `k` largest visible scores, in ascending position order.

    Args:
        scores: `[T, S]` float scores (no NaN among the visible ones).
        lens: `[T]` visible keys per row: positions `< min(lens[t], S)` take part.
        width: columns of the result (`k` of every row unless `k_rows` says less).
        k_rows: optional `[T]` keys wanted per row (clamped to `[0, width]`).
    Returns:
        `[T, width]` int64: row `t` lists `min(k_t, lens[t])` distinct positions ascending, then `-1`.
        Ties at the k-th largest value go to the lowest positions (one rule, so that the Triton
        kernel and this reference select the same set whenever their scores are equal).
    """
    t, s = scores.shape
    width_cols = min(width, s)
    pos = torch.arange(s, device=scores.device)
    visible = pos[None, :] < lens.to(scores.device).long()[:, None]
    # stable descending sort: equal scores keep ascending positions, so the first k of a row take
    # the lowest positions among ties; invisible keys sort last as -inf
    masked = scores.float().masked_fill(~visible, float("-inf"))
    order = torch.sort(masked, dim=-1, descending=True, stable=True).indices[:, :width_cols]
    want = torch.full((t,), width, dtype=torch.long, device=scores.device)
    if k_rows is not None:
        want = k_rows.to(scores.device).long().clamp(0, width)
    cols = torch.arange(width_cols, device=scores.device)
    keep = visible.gather(1, order) & (cols[None, :] < want[:, None])
    order = torch.where(keep, order, s).sort(dim=-1).values
    out = torch.full((t, width), -1, dtype=torch.long, device=scores.device)
    out[:, :width_cols] = torch.where(order < s, order, -1)
    return out

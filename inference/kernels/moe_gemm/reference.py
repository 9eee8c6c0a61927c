"""PyTorch references of the routed experts' two grouped GEMMs at decode sizes.

The `P = T * k` (token, slot) pairs are sorted by expert (`moe_dispatch.sort_pairs`): group `e` is
rows `[ends[e-1], ends[e])` (`ends[-1]` read as 0). `moe_up`: for each sorted pair, its token's row
of `x` against its expert's stacked gate|up weight `w13 [E, 2I, H]`, then SwiGLU,
`silu(x @ gate^T) * (x @ up^T)`, in fp32, rounded once to `x.dtype`: `[P, I]`. `moe_down`: each
pair's activation row against its expert's `w2 [E, H, I]`: `[P, H]`, fp32 sums rounded once.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["moe_down_reference", "moe_up_reference"]


def _groups(ends: Tensor) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of every non-empty group (reads `ends` on the host)."""
    bounds = [0, *ends.tolist()]
    return [(e, a, b) for e, (a, b) in enumerate(itertools.pairwise(bounds)) if b > a]


def moe_up_reference(x: Tensor, tok: Tensor, w13: Tensor, ends: Tensor) -> Tensor:
    """x `[T, H]`, tok `[P]` (token row of each sorted pair), w13 `[E, 2I, H]`, ends `[E]` int32
    -> `[P, I]` in `x.dtype`."""
    i = w13.shape[1] // 2
    out = torch.zeros(tok.shape[0], i, dtype=torch.float32, device=x.device)
    for e, a, b in _groups(ends):
        h = x[tok[a:b]].float() @ w13[e].float().T
        out[a:b] = F.silu(h[:, :i]) * h[:, i:]
    return out.to(x.dtype)


def moe_down_reference(act: Tensor, w2: Tensor, ends: Tensor) -> Tensor:
    """act `[P, I]` in sorted order, w2 `[E, H, I]`, ends `[E]` int32 -> `[P, H]` in `act.dtype`."""
    out = torch.zeros(act.shape[0], w2.shape[1], dtype=torch.float32, device=act.device)
    for e, a, b in _groups(ends):
        out[a:b] = act[a:b].float() @ w2[e].float().T
    return out.to(act.dtype)

"""PyTorch reference of sigmoid top-k routing with a score-correction bias (one expert group).

`scores = sigmoid(x @ W^T)` in fp32; the experts are chosen by `scores + bias` (top-k, ties to the
lower expert id), weighted by their uncorrected scores, optionally renormalised to sum to one,
then scaled. This is `TopKRouter`'s math for `num_groups == 1` (Kimi-Linear, and DeepSeek-style
configs without group-limited routing).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["sigmoid_topk_route_reference"]


def sigmoid_topk_route_reference(
    x: Tensor, weight: Tensor, bias: Tensor, top_k: int, renormalize: bool, scale: float
) -> tuple[Tensor, Tensor]:
    """x `[T, H]`, weight `[E, H]`, bias `[E]` -> (weights `[T, k]` fp32, ids `[T, k]` int64),
    ids in descending order of corrected score."""
    scores = torch.sigmoid(F.linear(x.float(), weight.float()))
    ids = (scores + bias.float()).topk(top_k, dim=-1).indices
    w = scores.gather(1, ids)
    if renormalize:
        w = w / (w.sum(-1, keepdim=True) + 1e-20)
    return w * scale, ids

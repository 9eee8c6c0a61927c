"""Feed-forward blocks: the dense SwiGLU MLP and the routed MoE with shared experts.

Parameter names follow the published Kimi-Linear checkpoint: `mlp.{gate,up,down}_proj` for dense
layers and `block_sparse_moe.{gate, experts.N.w1/w2/w3, shared_experts.*}` for MoE layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import MoESpec

__all__ = ["DenseMLP", "Expert", "SparseMoE", "TopKRouter"]


class DenseMLP(nn.Module):
    """`down(silu(gate(x)) * up(x))`."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`."""
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Expert(nn.Module):
    """One routed expert in the published layout: w1 = gate, w3 = up, w2 = down."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, hidden, bias=False)
        self.w3 = nn.Linear(hidden, intermediate, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        """x: `[n, hidden]` -> `[n, hidden]`."""
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TopKRouter(nn.Module):
    """Sigmoid scores, bias-corrected grouped top-k choice, weights from the uncorrected scores."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden))
        self.register_buffer("e_score_correction_bias", torch.zeros(spec.num_experts))

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """x: `[T, hidden]` -> `(weights [T, k] fp32, expert ids [T, k] int64)`."""
        s = self.spec
        scores = torch.sigmoid(F.linear(x.float(), self.weight.float()))
        choice = scores + self.e_score_correction_bias.float()
        if s.num_groups > 1:
            grouped = choice.view(-1, s.num_groups, s.num_experts // s.num_groups)
            group_score = grouped.topk(2, dim=-1).values.sum(-1)  # [T, G]
            keep = torch.zeros_like(group_score, dtype=torch.bool)
            keep.scatter_(1, group_score.topk(s.topk_groups, dim=-1).indices, True)
            choice = choice.masked_fill(
                ~keep.repeat_interleave(s.num_experts // s.num_groups, dim=1), -torch.inf
            )
        ids = choice.topk(s.top_k, dim=-1).indices
        weights = scores.gather(1, ids)
        if s.renormalize:
            weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
        return weights * s.routed_scaling_factor, ids


class SparseMoE(nn.Module):
    """Routed experts plus always-on shared experts."""

    def __init__(self, hidden: int, spec: MoESpec) -> None:
        super().__init__()
        self.spec = spec
        self.gate = TopKRouter(hidden, spec)
        self.experts = nn.ModuleList(Expert(hidden, spec.intermediate_size) for _ in range(spec.num_experts))
        self.shared_experts = (
            DenseMLP(hidden, spec.intermediate_size * spec.num_shared_experts)
            if spec.num_shared_experts
            else None
        )

    def forward(self, x: Tensor) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`."""
        weights, ids = self.gate(x)
        out = torch.zeros_like(x)
        # Token-sorted dispatch: one gather/scatter per expert that received tokens.
        flat = ids.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.spec.num_experts).tolist()
        token_of = order // self.spec.top_k
        w_of = weights.flatten()[order]
        start = 0
        for e, n in enumerate(counts):
            if n == 0:
                continue
            tok = token_of[start : start + n]
            y = self.experts[e](x[tok]) * w_of[start : start + n, None]
            out.index_add_(0, tok, y.to(out.dtype))
            start += n
        if self.shared_experts is not None:
            out = out + self.shared_experts(x)
        return out

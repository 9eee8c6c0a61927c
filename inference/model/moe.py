"""Feed-forward blocks: the dense SwiGLU MLP and the routed MoE with shared experts.

Parameter names follow the published checkpoints: `mlp.{gate,up,down}_proj` for dense layers;
Kimi-Linear's MoE layers are `block_sparse_moe.{gate, experts.N.w1/w2/w3, shared_experts.*}`,
DeepSeek-V3's `mlp.{gate, experts.N.gate_proj/up_proj/down_proj, shared_experts.*}` (`DeepseekExpert`).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from inference.config import MoESpec
from inference.kernels.moe_dispatch import silu_mul
from inference.kernels.moe_experts import moe_experts_grouped, moe_experts_reference, use_grouped_moe
from inference.kernels.moe_gemv import moe_gemv, moe_gemv_applies
from inference.kernels.moe_router import sigmoid_topk_route
from inference.model.fused_params import concat_params

__all__ = ["DeepseekExpert", "DenseMLP", "Expert", "SparseMoE", "TopKRouter"]


class DenseMLP(nn.Module):
    """`down(silu(gate(x)) * up(x))`."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        self._gate_up: Tensor | None = None

    def stacked(self) -> tuple[Tensor, Tensor]:
        """`(gate|up [2I, hidden], down [hidden, I])`: the layout of one routed expert's stacks."""
        self._gate_up = concat_params([self.gate_proj.weight, self.up_proj.weight], self._gate_up)
        return self._gate_up.view(-1, self.down_proj.weight.shape[0]), self.down_proj.weight

    def forward(self, x: Tensor) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]` (gate and up as one GEMM)."""
        return self.down_proj(silu_mul(F.linear(x, self.stacked()[0])))


class Expert(nn.Module):
    """One routed expert's weights in the published layout: w1 = gate, w3 = up, w2 = down.

    A holder only: `SparseMoE` computes all experts at once (`inference/kernels/moe_experts`).
    """

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(hidden, intermediate, bias=False)
        self.w2 = nn.Linear(intermediate, hidden, bias=False)
        self.w3 = nn.Linear(hidden, intermediate, bias=False)

    def weights(self) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
        """(gate, up, down) weights, whatever the checkpoint calls them."""
        return self.w1.weight, self.w3.weight, self.w2.weight


class DeepseekExpert(nn.Module):
    """One routed expert in the DeepSeek-V3 layout (`gate_proj`, `up_proj`, `down_proj`); a holder as `Expert`."""

    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def weights(self) -> tuple[nn.Parameter, nn.Parameter, nn.Parameter]:
        """(gate, up, down) weights."""
        return self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight


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
        if s.num_groups == 1:  # two Triton kernels on CUDA (`inference/kernels/moe_router`)
            return sigmoid_topk_route(
                x, self.weight, self.e_score_correction_bias, s.top_k, s.renormalize, s.routed_scaling_factor
            )
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
    """Routed experts plus always-on shared experts.

    Where the kernel registry picks the grouped path (family `moe_experts`: CUDA, bf16,
    `torch._grouped_mm`) the routed experts run as two grouped GEMMs over stacked
    `[E, 2I, H]` / `[E, H, I]` weights, sync-free so a decode step can be captured in a CUDA graph.
    The stacks are built on first use and the per-expert parameters are re-pointed into them, so the
    published `experts.N.w1/w2/w3` names keep working (state_dict, loading) with no second copy.
    Elsewhere the per-expert reference loop runs. At a few tokens (`moe_gemv_applies`: decode) the
    whole block, routed and shared experts, is two GEMV kernels instead (`inference/kernels/moe_gemv`).
    """

    def __init__(
        self, hidden: int, spec: MoESpec, expert_cls: type[Expert | DeepseekExpert] = Expert
    ) -> None:
        super().__init__()
        if spec.scoring != "sigmoid" or spec.shared_expert_gate:
            raise ValueError(
                "SparseMoE implements sigmoid, bias-corrected routing without a shared-expert gate"
            )
        self.spec = spec
        self.gate = TopKRouter(hidden, spec)
        self.experts = nn.ModuleList(
            expert_cls(hidden, spec.intermediate_size) for _ in range(spec.num_experts)
        )
        self.shared_experts = DenseMLP(hidden, spec.shared_width) if spec.num_shared_experts else None
        self._w13: Tensor | None = None
        self._w2: Tensor | None = None

    def expert_modules(self) -> list[nn.Module]:
        """The routed experts this module computes, in id order (a parallel rank: its own)."""
        return list(self.experts)

    def _stacked(self) -> tuple[Tensor, Tensor]:
        """`(w13 [E, 2I, H], w2 [E, H, I])` views of the experts' own (re-pointed) parameters."""
        experts = self.expert_modules()
        e, i = len(experts), experts[0].weights()[0].shape[0]
        self._w13 = concat_params([w for x in experts for w in x.weights()[:2]], self._w13)
        self._w2 = concat_params([x.weights()[2] for x in experts], self._w2)
        return self._w13.view(e, 2 * i, -1), self._w2.view(e, -1, i)

    def routed(self, x: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        """Weighted sum of the chosen experts' outputs `[T, hidden]`; `ids` index `expert_modules()`."""
        if use_grouped_moe(x):
            return moe_experts_grouped(x, weights, ids, *self._stacked())
        gate, up, down = zip(*(e.weights() for e in self.expert_modules()), strict=True)
        return moe_experts_reference(x, weights, ids, list(gate), list(down), list(up))

    def forward(self, x: Tensor) -> Tensor:
        """x: `[T, hidden]` -> `[T, hidden]`."""
        weights, ids = self.gate(x)
        if moe_gemv_applies(x):  # a few tokens (decode): routed and shared experts in two GEMVs
            shared_w = self.shared_experts.stacked() if self.shared_experts is not None else None
            return moe_gemv(x, weights, ids, *self._stacked(), shared=shared_w)
        shared = self.shared_experts(x) if self.shared_experts is not None else None
        if use_grouped_moe(x):
            # the shared experts' sum fused into the routed combine
            return moe_experts_grouped(x, weights, ids, *self._stacked(), shared=shared)
        out = self.routed(x, weights, ids)
        return out if shared is None else out + shared

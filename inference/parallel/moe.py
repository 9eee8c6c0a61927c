"""Expert parallelism: routed experts split over the EP group, token dispatch/combine by all-to-all.

Layout: EP rank `e` holds experts `[e * E/ep, (e+1) * E/ep)`, each sliced `tp` ways on its
intermediate dim (TP inside experts); the shared expert is sliced over the whole world when its
width divides, else over the TP group and run by EP rank 0 only. The router is replicated (every
rank routes the same replicated tokens to the same ids).

Per MoE layer (tokens `[T, H]` are replicated on every rank after the attention all-reduce):

1. each EP rank owns a contiguous `T / ep` chunk of tokens and sends each (token, slot) pair of
   its chunk to the rank holding that expert (`all_to_all` of the rows, of the expert ids, and of
   the counts first: split sizes must be known on the host);
2. each rank runs its experts on what it received (the same grouped/reference compute as TP=1);
3. the outputs go back the same way (`all_to_all`), the owner weights and sums them per token
   into rows of a zero `[T, H]`;
4. one all-reduce over the world adds the owners' rows, the TP partial sums of the sliced experts
   and the shared expert's partial sums: still one collective that completes the sublayer.

`all_to_all` runs on gloo (checked with torch 2.14 and present since torch 1.x) and NCCL. The
count exchange reads sizes on the host, so an EP step cannot be captured in a CUDA graph.
With `ep == 1` steps 1-3 are local: every rank has all experts (TP-sliced) and all tokens.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from inference.model.moe import DenseMLP, SparseMoE
from inference.parallel.comm import MeshGroups

__all__ = ["ParallelSparseMoE"]


class ParallelSparseMoE(SparseMoE):
    """`SparseMoE` over this rank's experts (a `ModuleDict` keyed by global expert id, so parameter
    names stay the checkpoint's `experts.N.*`) with the dispatch/combine described above."""

    def __init__(
        self,
        moe: SparseMoE,
        experts: dict[int, nn.Module],
        shared: DenseMLP | None,
        shared_active: bool,
        mesh: MeshGroups,
    ) -> None:
        nn.Module.__init__(self)
        self.spec = moe.spec
        self.gate = moe.gate
        self.experts = nn.ModuleDict({str(i): m for i, m in experts.items()})
        self.first_expert = min(experts)
        self.per_rank = len(experts)
        self.shared_experts = shared
        self.shared_active = shared_active
        self.mesh = mesh
        self._w13: Tensor | None = None
        self._w2: Tensor | None = None

    def expert_modules(self) -> list[nn.Module]:
        return list(self.experts.values())

    def forward(self, x: Tensor) -> Tensor:
        """x: `[T, hidden]` (replicated) -> `[T, hidden]` (replicated)."""
        weights, ids = self.gate(x)
        if self.mesh.ep.size == 1:
            out = self.routed(x, weights, ids)
        else:
            out = self._dispatch_combine(x, weights, ids)
        if self.shared_experts is not None and self.shared_active:
            out = out + self.shared_experts(x)
        return self.mesh.world.all_reduce(out, "moe")

    def _dispatch_combine(self, x: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        ep = self.mesh.ep
        t, k = ids.shape
        lo, hi = t * ep.rank // ep.size, t * (ep.rank + 1) // ep.size
        pair_ids = ids[lo:hi].reshape(-1)
        dest = pair_ids // self.per_rank
        order = dest.argsort(stable=True)  # pairs grouped by destination rank
        tok = (torch.arange(lo, hi, device=x.device).repeat_interleave(k))[order]
        send = torch.bincount(dest, minlength=ep.size)
        recv = ep.all_to_all(send, [1] * ep.size, [1] * ep.size, "moe.counts")
        send_l, recv_l = send.tolist(), recv.tolist()
        local_ids = pair_ids[order] - dest[order] * self.per_rank
        rx = ep.all_to_all(x[tok], send_l, recv_l, "moe.dispatch")
        rid = ep.all_to_all(local_ids, send_l, recv_l, "moe.dispatch_ids")
        if rx.shape[0]:
            ones = torch.ones(rx.shape[0], 1, dtype=torch.float32, device=x.device)
            y = self.routed(rx, ones, rid[:, None])
        else:
            y = rx
        back = ep.all_to_all(y, recv_l, send_l, "moe.combine")
        w = weights[lo:hi].reshape(-1)[order]
        out = torch.zeros_like(x)
        return out.index_add_(0, tok, (back.float() * w[:, None]).to(x.dtype))

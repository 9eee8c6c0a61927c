"""Expert parallelism: routed experts split over the EP group; two dispatch/combine schemes.

Layout: EP rank `e` holds experts `[e * E/ep, (e+1) * E/ep)`, each sliced `tp` ways on its
intermediate dim (TP inside experts); the shared expert is sliced over the whole stage (its TP x EP ranks) when its
width divides, else over the TP group and run by EP rank 0 only. The router is replicated: every
rank routes the same replicated tokens (`[T, H]` after the attention all-reduce) to the same ids,
so every rank knows where every (token, slot) pair goes without asking.

`expert_dispatch="local"` (the default): each rank runs the pairs routed to its own experts from
the tokens it already holds and weights and sums the outputs. No rows move: with attention
replicated over EP (no data-parallel attention), every rank has every token, so an all-gather
would be free and an all-to-all would only move rows the receiver already has. Two forms, by the
step's pair count (`MASKED_MAX_PAIRS`, one rule): up to it (decode, short steps) every pair stays
in place, a foreign pair is sent to a local expert with weight 0 -- fixed shapes and no host sync,
so the step can be captured in a CUDA graph, and at these sizes the expert GEMMs are bound by
reading the local experts' weights, not by the extra rows; above it (prefill) the rank's own
pairs are compacted first (`nonzero`, a host sync) so it computes only `1/ep` of the rows.

`expert_dispatch="all_to_all"`: each EP rank owns a contiguous `T / ep` chunk of the tokens and
sends the rows of its chunk's pairs to the experts' ranks (`all_to_all`, split sizes computed
locally from the replicated routing: no count or id exchange), the outputs come back the same
way and the owner weights and sums them. This is the exchange data-parallel attention would need; here it
is kept to measure against "local" (`benchmarks/parallel.py --expert-dispatch`). `all_to_all`
runs on gloo (checked with torch 2.14; present since torch 1.x) and NCCL.

Either way one all-reduce over the stage completes the sublayer: it adds the experts' partial
sums (EP and TP slices) and the sliced shared expert. `all_to_all` reads its split sizes on the
host, so only "local" EP steps (in their masked form) can be captured in a CUDA graph
(`worker.decode_graphs_on`). With `ep == 1` every rank has all experts (TP-sliced) and the routed
compute is the TP=1 code.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from inference.model.moe import DenseMLP, SparseMoE
from inference.model.qwen3_next import Qwen3NextSparseMoE
from inference.parallel.comm import MeshGroups

__all__ = ["MASKED_MAX_PAIRS", "ParallelQwen3NextMoE", "ParallelSparseMoE"]

# A "local" EP step of at most this many (token, slot) pairs keeps them all in place (masked:
# sync-free, capturable); a larger one compacts its own pairs first. 4,096 covers every decode
# graph bucket (up to 512 sequences) at top-8 routing. What the masked form costs: every rank
# computes all pairs instead of ~1/ep of them, which stays hidden under the read of its experts'
# weights while pairs <~ 160 x local experts (bf16 on an H200: ~700 TFLOP/s over ~4.3 TB/s, and a
# row costs one FLOP per byte of its expert's weights), i.e. ~2,600 pairs at 16 local experts,
# ~5,200 at 32.
MASKED_MAX_PAIRS = 4096


class ParallelSparseMoE(SparseMoE):
    """`SparseMoE` over this rank's experts (a `ModuleDict` keyed by global expert id, so parameter
    names stay the checkpoint's `experts.N.*`) with the dispatch/combine described above."""

    def __init__(
        self,
        moe: SparseMoE | Qwen3NextSparseMoE,
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
        self.all_to_all = mesh.config.expert_dispatch == "all_to_all"
        self._w13: Tensor | None = None
        self._w2: Tensor | None = None

    def expert_modules(self) -> list[nn.Module]:
        return list(self.experts.values())

    def forward(self, x: Tensor) -> Tensor:
        """x: `[T, hidden]` (replicated) -> `[T, hidden]` (replicated)."""
        weights, ids = self.gate(x)
        if self.mesh.ep.size == 1:
            out = self.routed(x, weights, ids)
        elif self.all_to_all:
            out = self._exchange(x, weights, ids)
        else:
            out = self._local(x, weights, ids)
        if self.shared_active:
            out = self._shared(x, out)
        return self.mesh.stage.all_reduce(out, "moe")

    def _shared(self, x: Tensor, out: Tensor) -> Tensor:
        """`out` plus this rank's slice of the shared expert."""
        return out if self.shared_experts is None else out + self.shared_experts(x)

    def _run_pairs(self, rows: Tensor, local_ids: Tensor) -> Tensor:
        """Unweighted expert outputs of `rows` `[P, H]`, pair `p` through local expert `local_ids[p]`."""
        if not rows.shape[0]:
            return rows
        ones = torch.ones(rows.shape[0], 1, dtype=torch.float32, device=rows.device)
        return self.routed(rows, ones, local_ids[:, None])

    @staticmethod
    def _combine(x: Tensor, tok: Tensor, y: Tensor, w: Tensor) -> Tensor:
        out = torch.zeros_like(x)
        return out.index_add_(0, tok, (y.float() * w[:, None]).to(x.dtype))

    def _local(self, x: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        if ids.numel() <= MASKED_MAX_PAIRS:
            return self._masked(x, weights, ids)
        k = ids.shape[1]
        flat = ids.reshape(-1)
        pair = ((flat >= self.first_expert) & (flat < self.first_expert + self.per_rank)).nonzero().squeeze(1)
        tok = pair // k
        y = self._run_pairs(x[tok], flat[pair] - self.first_expert)
        return self._combine(x, tok, y, weights.reshape(-1)[pair])

    def _masked(self, x: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        """Every pair in place: a foreign pair runs on local expert `pair % per_rank` (spread, so
        no one expert's group grows by all of them) with weight 0, and adds exactly nothing."""
        local = ids - self.first_expert
        mine = (local >= 0) & (local < self.per_rank)
        spread = torch.arange(ids.numel(), device=ids.device).view_as(ids) % self.per_rank
        return self.routed(x, torch.where(mine, weights, 0.0), torch.where(mine, local, spread))

    def _exchange(self, x: Tensor, weights: Tensor, ids: Tensor) -> Tensor:
        ep = self.mesh.ep
        t, k = ids.shape
        bounds = [t * r // ep.size for r in range(ep.size + 1)]
        dest_all = ids // self.per_rank  # [T, k], replicated: every rank knows every route
        owner = torch.bucketize(
            torch.arange(t, device=x.device), torch.tensor(bounds[1:-1], device=x.device), right=True
        )
        to_me = (dest_all == ep.rank).sum(1)  # pairs of each token bound for this rank
        recv = torch.zeros(ep.size, dtype=torch.long, device=x.device).index_add_(0, owner, to_me).tolist()
        lo, hi = bounds[ep.rank], bounds[ep.rank + 1]
        dest = dest_all[lo:hi].reshape(-1)
        order = dest.argsort(stable=True)  # this chunk's pairs grouped by destination rank
        send = torch.bincount(dest, minlength=ep.size).tolist()
        tok = torch.arange(lo, hi, device=x.device).repeat_interleave(k)[order]
        rx = ep.all_to_all(x[tok], send, recv, "moe.dispatch")
        # what arrives: every chunk's pairs bound here, chunk after chunk, each in (token, slot)
        # order (stable sort) -- i.e. all such pairs in flat order, so their ids are known here
        flat = ids.reshape(-1)
        rid = flat[dest_all.reshape(-1) == ep.rank] - self.first_expert
        back = ep.all_to_all(self._run_pairs(rx, rid), recv, send, "moe.combine")
        return self._combine(x, tok, back, weights[lo:hi].reshape(-1)[order])


class ParallelQwen3NextMoE(ParallelSparseMoE):
    """Qwen3-Next's MoE over the mesh: softmax-routed experts placed and exchanged as above; its
    one shared expert (`shared_expert`, sliced like `shared_experts`) scaled by the replicated
    `sigmoid(shared_expert_gate(x))`, a per-token factor, so each rank scales its own partial sum
    and the one all-reduce adds them."""

    def __init__(
        self,
        moe: Qwen3NextSparseMoE,
        experts: dict[int, nn.Module],
        shared: DenseMLP,
        shared_active: bool,
        mesh: MeshGroups,
    ) -> None:
        super().__init__(moe, experts, None, shared_active, mesh)
        self.shared_expert = shared  # the checkpoint's names: `mlp.shared_expert.*`
        self.shared_expert_gate = moe.shared_expert_gate

    def _shared(self, x: Tensor, out: Tensor) -> Tensor:
        return out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

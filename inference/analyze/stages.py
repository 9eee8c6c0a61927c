"""Pipeline stages: which contiguous decoder layers each stage runs, and what a stage's GPU holds.

One plan serves the runtime and `dayzero analyze`: the parallel engine cuts its model by
`plan_stages` (`inference/parallel/pipeline.py`) and analyze reports the same stages' memory, so
a change to the rule changes both. Torch-free.

The rule: a stage's cost is the sum of its layers' costs, the last stage also pays the LM head;
the plan is the contiguous split into `pp` non-empty stages whose most expensive stage is the
cheapest (ties: the earliest cut). A layer's modelled cost is the parameters a decode step reads
(`params.layer_params`: mixer, norms, the dense FFN or every routed expert plus router and shared
expert: at a decode batch of `pp` or more sequences most experts are touched, and decode is bound
by the bytes it reads), so a KDA layer, an MLA/DSA layer and a dense or MoE FFN each weigh what
they stream. Measured costs (seconds per layer, e.g. from a profile) can be given instead.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from inference.analyze.params import KV_DTYPE_BYTES, kv_per_layer, layer_params, state_per_layer
from inference.config import GQA, ModelSpec

__all__ = ["StageMemory", "StagePlan", "layer_costs", "plan_stages", "stage_memory"]


@dataclass(frozen=True, slots=True)
class StagePlan:
    """`bounds[p] .. bounds[p + 1]` are stage `p`'s layers; `costs[p]` what the rule weighed."""

    bounds: tuple[int, ...]
    costs: tuple[float, ...]

    @property
    def num_stages(self) -> int:
        return len(self.bounds) - 1

    def layers(self, stage: int) -> range:
        return range(self.bounds[stage], self.bounds[stage + 1])

    def stage_of(self, layer: int) -> int:
        for p in range(self.num_stages):
            if layer < self.bounds[p + 1]:
                return p
        raise ValueError(f"layer {layer} is past the last stage ({self.bounds[-1]} layers)")

    def describe(self) -> str:
        return ", ".join(
            f"stage {p}: layers {r.start}-{r.stop - 1} (cost {self.costs[p]:.3g})"
            for p, r in ((p, self.layers(p)) for p in range(self.num_stages))
        )


def layer_costs(s: ModelSpec) -> list[float]:
    """The modelled cost of each decoder layer: the parameters a decode step reads."""
    return [float(layer_params(s, i)) for i in range(s.num_layers)]


def _head_cost(s: ModelSpec) -> float:
    return float(s.vocab_size * s.hidden_size)  # the LM head's GEMM, on the last stage


def plan_stages(s: ModelSpec, pp: int, costs: Sequence[float] | None = None) -> StagePlan:
    """Split `s`'s layers into `pp` contiguous stages minimising the most expensive one.

    `costs`: measured cost per layer (same order), else `layer_costs(s)`; the LM head is added to
    the last stage in the units of the modelled cost (only when `costs` is None)."""
    n = s.num_layers
    if pp < 1 or pp > n:
        raise ValueError(f"--pipeline-parallel-size {pp} must be between 1 and the {n} layers")
    c = list(costs) if costs is not None else layer_costs(s)
    if len(c) != n:
        raise ValueError(f"{len(c)} layer costs given for {n} layers")
    head = _head_cost(s) if costs is None else 0.0
    prefix = [0.0]
    for x in c:
        prefix.append(prefix[-1] + x)

    def cost(i: int, j: int) -> float:
        return prefix[j] - prefix[i] + (head if j == n else 0.0)

    # best[k][j]: the cheapest most-expensive stage splitting layers [0, j) into k stages
    inf = math.inf
    best = [[inf] * (n + 1) for _ in range(pp + 1)]
    cut = [[0] * (n + 1) for _ in range(pp + 1)]
    best[0][0] = 0.0
    for k in range(1, pp + 1):
        for j in range(k, n - (pp - k) + 1):
            for i in range(k - 1, j):
                v = max(best[k - 1][i], cost(i, j))
                if v < best[k][j]:
                    best[k][j], cut[k][j] = v, i
    bounds = [n]
    for k in range(pp, 0, -1):
        bounds.append(cut[k][bounds[-1]])
    bounds.reverse()
    return StagePlan(tuple(bounds), tuple(cost(bounds[p], bounds[p + 1]) for p in range(pp)))


@dataclass(frozen=True, slots=True)
class StageMemory:
    """Per GPU of one stage: its share of the stage's weights (parameters), the KV bytes per token
    and recurrent-state bytes per sequence its layers keep (bf16 KV, fp32 states)."""

    stage: int
    layers: range
    params_per_gpu: float
    kv_bytes_per_token: float
    state_bytes_per_sequence: float


def stage_memory(s: ModelSpec, plan: StagePlan, tp: int, per_gpu_params: float) -> list[StageMemory]:
    """Each stage's memory per GPU, splitting one rank's whole-model shard (`per_gpu_params`, from
    `plan.rank_params`) over the stages by their layers' parameters (embedding rows on the first
    stage, the LM head on the last), the MLA latent per token whole on every TP rank (GQA K|V by
    KV head) and the recurrent states by head."""
    h = s.hidden_size
    table = s.vocab_size * h
    head = 0 if s.tie_word_embeddings else table
    whole = table + head + sum(layer_params(s, i) for i in range(s.num_layers))
    out = []
    for p in range(plan.num_stages):
        layers = plan.layers(p)
        n = sum(layer_params(s, i) for i in layers)
        n += table if p == 0 else 0
        n += head if p == plan.num_stages - 1 else 0
        kv = 0.0
        state = 0.0
        for i in layers:
            kind = s.layer_kinds[i]
            per = kv_per_layer(s, kind, KV_DTYPE_BYTES)
            kv += per / min(tp, s.gqa.num_kv_heads) if kind == GQA else per
            state += state_per_layer(s, kind, KV_DTYPE_BYTES) / tp
        out.append(StageMemory(p, layers, per_gpu_params * n / whole, kv, state))
    return out

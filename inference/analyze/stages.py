"""Pipeline stages: which contiguous decoder layers each stage runs, what a stage's GPU holds, and
how many hosts (one stage each) a model needs.

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
from inference.analyze.plan import HEADROOM, WEIGHT_BYTES, GiB, rank_params
from inference.config import GQA, ModelSpec
from inference.parallel.split_rule import split_problem

__all__ = ["NodePlan", "StageMemory", "StagePlan", "layer_costs", "plan_nodes", "plan_stages", "stage_memory"]


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
    """Per GPU of one stage: its weights (`plan.rank_params` of its layers), the KV bytes per
    token and recurrent-state bytes per sequence its layers keep (bf16 KV, fp32 states), and the
    sequences of `context` tokens that fit beside them."""

    stage: int
    layers: tuple[int, int]  # [start, stop)
    weight_bytes: float
    kv_bytes_per_token: float
    state_bytes_per_sequence: float
    max_sequences: int


def stage_memory(
    s: ModelSpec, stages: StagePlan, tp: int, weight_bytes: float, usable: float, context: int
) -> list[StageMemory]:
    """Each stage's memory per GPU on `tp` GPUs (the runtime's split rule: MLA latent per token
    whole on every TP rank, GQA K|V by KV head, recurrent states by head; routed experts 1/tp per
    GPU, as `--tensor-parallel-size tp` slices them and as EP = TP over the same GPUs holds them)."""
    out = []
    last = stages.num_stages - 1
    for p in range(stages.num_stages):
        layers = stages.layers(p)
        w = rank_params(s, tp, 1, layers, first=p == 0, last=p == last) * weight_bytes
        kv = 0.0
        state = 0.0
        for i in layers:
            kind = s.layer_kinds[i]
            per = kv_per_layer(s, kind, KV_DTYPE_BYTES)
            kv += per / min(tp, s.gqa.num_kv_heads) if kind == GQA else per
            state += state_per_layer(s, kind, KV_DTYPE_BYTES) / tp
        per_seq = kv * context + state
        n = max(0, math.floor((usable - w) / per_seq)) if per_seq else (1 << 30 if usable > w else 0)
        out.append(StageMemory(p, (layers.start, layers.stop), w, kv, state, n))
    return out


@dataclass(frozen=True, slots=True)
class NodePlan:
    """One replica over `nodes` hosts of `gpus_per_node` GPUs: TP = EP = `gpus_per_node` inside a
    host, one pipeline stage per host (only activations cross hosts)."""

    nodes: int
    gpus_per_node: int
    stages: StagePlan
    memory: list[StageMemory]
    sequences: int

    @property
    def max_sequences(self) -> int:
        return min(m.max_sequences for m in self.memory)

    @property
    def fits(self) -> bool:
        return self.max_sequences >= self.sequences


def plan_nodes(
    s: ModelSpec,
    gpus_per_node: int,
    gpu_mem_gib: float,
    context: int,
    weight_dtype: str = "bf16",
    sequences: int = 1,
    max_nodes: int = 64,
) -> NodePlan | None:
    """The fewest hosts (one pipeline stage each, TP x EP over a host's GPUs) whose fullest stage
    holds its weights and `sequences` of `context` tokens with 20% headroom; the last one tried
    (not fitting) when none up to `max_nodes` does, None when the host's GPUs cannot split it."""
    if split_problem(s, gpus_per_node, gpus_per_node):
        return None
    usable = gpu_mem_gib * GiB * (1 - HEADROOM)
    plan = None
    for nodes in range(1, min(max_nodes, s.num_layers) + 1):
        stages = plan_stages(s, nodes)
        memory = stage_memory(s, stages, gpus_per_node, WEIGHT_BYTES[weight_dtype], usable, context)
        plan = NodePlan(nodes, gpus_per_node, stages, memory, sequences)
        if plan.fits:
            break
    return plan


def format_nodes(plan: NodePlan, weight_dtype: str, context: int) -> list[str]:
    """`dayzero analyze --gpus-per-node`'s lines: the hosts, and per stage its layers and memory."""
    g = plan.gpus_per_node
    verdict = f"fits, up to {plan.max_sequences} sequences" if plan.fits else "DOES NOT FIT"
    lines = [
        f"nodes: {plan.nodes} x {g} GPUs = {plan.nodes * g} GPUs, TP={g} EP={g} inside a node, "
        f"PP={plan.nodes} across nodes ({weight_dtype} weights, {context} tokens per sequence): {verdict}"
    ]
    for m in plan.memory:
        lines.append(
            f"  stage {m.stage} (node {m.stage}): layers {m.layers[0]}-{m.layers[1] - 1}, weights "
            f"{m.weight_bytes / GiB:.2f} GiB/GPU, KV {m.kv_bytes_per_token:.0f} B/token, state "
            f"{m.state_bytes_per_sequence / 2**20:.2f} MiB/sequence per GPU: up to {m.max_sequences} sequences"
        )
    return lines

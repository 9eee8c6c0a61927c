"""Structure-first analysis of a model config: operators, parameters, memory, a parallel plan, and
the diff between two configs (what a Day-0 team must build).

Pure Python (no torch): `dayzero analyze` answers in milliseconds on any machine, for a model
whose weights are not public yet. `params` counts, `operators` inventories, `plan` splits over
GPUs; this module puts them together (`analyze`, `diff`) and formats them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from inference.analyze.advice import context_warnings, fit_suggestions
from inference.analyze.operators import Op, operators
from inference.analyze.params import cache_bytes, parameter_counts
from inference.analyze.plan import (
    HEADROOM,
    MAX_GPUS,
    WEIGHT_BYTES,
    GiB,
    ParallelPlan,
    driver_params,
    fewest_gpus_plans,
    plan_parallel,
    rank_params,
)
from inference.analyze.stages import NodePlan, format_nodes, plan_nodes
from inference.analyze.weights import WeightBytes, weight_bytes
from inference.config import DENSE, GDN, GQA, KDA, MLA, MOE, ModelSpec

__all__ = [
    "HEADROOM",
    "WEIGHT_BYTES",
    "Analysis",
    "Diff",
    "Op",
    "ParallelPlan",
    "WeightBytes",
    "analyze",
    "cache_bytes",
    "diff",
    "driver_params",
    "format_analysis",
    "format_diff",
    "operators",
    "parameter_counts",
    "plan_parallel",
    "rank_params",
    "to_json",
    "weight_bytes",
]


@dataclass(frozen=True, slots=True)
class Analysis:
    """What `dayzero analyze` prints (`asdict` gives the `--json` form)."""

    model_type: str
    layers: dict[str, int]
    operators: dict[str, list[Op]]
    params: dict[str, int]
    params_by_component: dict[str, int]
    weight_dtype: str
    weight_bytes: dict[str, float]
    stored: WeightBytes  # the checkpoint's bytes on disk and this runtime's after load
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    context: int
    memory_per_sequence_bytes: int
    plan: ParallelPlan | None = None
    alternatives: list[ParallelPlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # about the request (`advice`)
    suggestions: list[str] = field(default_factory=list)  # when no plan fits: what would (`advice`)
    nodes: NodePlan | None = None  # with `gpus_per_node`: one pipeline stage per host


def _display_name(s: ModelSpec) -> str:
    """`kimi_k25(kimi_k2)` for a wrapper, else the text model type."""
    return s.model_type if s.wrapper_type is None else f"{s.wrapper_type}({s.model_type})"


def analyze(
    s: ModelSpec,
    *,
    gpus: int | None = None,
    gpu_mem_gib: float = 80.0,
    context: int = 131072,
    weight_dtype: str | None = None,
    sequences: int = 1,
    gpus_per_node: int | None = None,
) -> Analysis:
    """Analyse `s` and plan the fewest GPUs (up to `gpus`, default `MAX_GPUS`) that hold it with 20% headroom.

    `weight_dtype` (the plan's bytes per weight) defaults to bf16: what this runtime holds, since it
    dequantizes FP8 / INT4 checkpoints at load; `fp8` / `int4` plan a runtime that keeps them.
    `gpus_per_node`: also plan hosts of that many GPUs, TP x EP inside each, PP across them.
    """
    weight_dtype = weight_dtype or "bf16"
    if weight_dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight dtype must be one of {sorted(WEIGHT_BYTES)}, got {weight_dtype!r}")
    for name, value in (("gpus", gpus), ("context", context), ("sequences", sequences)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    head, comp = parameter_counts(s)
    kv_tok, state_seq = cache_bytes(s)
    plans = fewest_gpus_plans(s, gpus or MAX_GPUS, gpu_mem_gib, context, weight_dtype, sequences)
    notes = []
    if s.mtp is not None:
        notes.append(
            f"{s.mtp.num_layers} MTP layer(s) in the checkpoint ({head['mtp'] / 1e9:.2f}B), not served"
        )
    if s.mla is not None and s.mla.rope_scaling is not None:
        y = dict(s.mla.rope_scaling)
        notes.append(
            f"YaRN rope scaling x{y['factor']} of {y['original_max_position_embeddings']} trained positions "
            "(served: angles and softmax temperature in the MLA layer)"
        )
    stored = weight_bytes(s)
    if s.quantization is not None:
        q = s.quantization
        layout = f"{q.block[0]}x{q.block[1]} tiles" if q.method == "fp8" else f"groups of {q.group_size}"
        notes.append(
            f"checkpoint stores {_fmt_n(stored.quantized_params)} weights as {q.method} ({layout}); "
            f"dequantized to bf16 at load: {_fmt_b(stored.disk)} on disk -> {_fmt_b(stored.memory)} in memory"
        )
    if s.mla is not None and MLA in s.layer_kinds:
        # the runtime's choice (inference/parallel/sharding.py), counted by the plans' KV per GPU
        notes.append(
            "tensor parallel: every rank keeps the whole MLA latent cache"
            + (" and DSA indexer keys" if s.dsa is not None else "")
            + " (all heads read the whole latent), so KV per GPU does not shrink with TP; "
            "recurrent states split by head"
        )
    if s.vision is not None:
        n = driver_params(s)
        notes.append(
            f"vision tower + projector ({_fmt_n(n)}, {_fmt_b(n * WEIGHT_BYTES['bf16'])} bf16) "
            "held whole by the driver on GPU 0, not split; the GPUs shard only the language model, "
            "and GPU 0's remaining memory sizes every GPU's KV/state pool"
        )
    return Analysis(
        model_type=_display_name(s),
        layers={kind: s.layer_kinds.count(kind) for kind in (KDA, MLA, GDN, GQA)}
        | {
            "dense_mlp": s.mlp_kinds.count(DENSE),
            "moe": s.mlp_kinds.count(MOE),
            "dsa": s.layer_kinds.count(MLA) if s.dsa else 0,
        },
        operators=operators(s),
        params=head,
        params_by_component=comp,
        weight_dtype=weight_dtype,
        weight_bytes={k: head["total"] * v for k, v in WEIGHT_BYTES.items()},
        stored=stored,
        kv_bytes_per_token=kv_tok,
        state_bytes_per_sequence=state_seq,
        context=context,
        memory_per_sequence_bytes=kv_tok * context + state_seq,
        plan=plans[0] if plans else None,
        alternatives=plans[1:4],
        notes=notes,
        warnings=context_warnings(s, context),
        suggestions=fit_suggestions(
            s,
            gpus=gpus,
            gpu_mem_gib=gpu_mem_gib,
            context=context,
            weight_dtype=weight_dtype,
            sequences=sequences,
            plan=plans[0] if plans else None,
        ),
        nodes=plan_nodes(s, gpus_per_node, gpu_mem_gib, context, weight_dtype, sequences)
        if gpus_per_node
        else None,
    )


@dataclass(frozen=True, slots=True)
class Diff:
    """What B needs that A does not have: new operators, new shapes of known ones, memory change."""

    a: str
    b: str
    new_operators: list[tuple[str, Op]]  # (layer kind, op) whose name A never uses
    new_shapes: list[tuple[str, Op, str]]  # (layer kind, op in B, A's shape of the same op)
    dropped_operators: list[tuple[str, Op]]
    memory: dict[str, dict[str, float]]  # figure -> {"a", "b", "delta"}


def diff(a: ModelSpec, b: ModelSpec, *, context: int = 131072) -> Diff:
    """Operators and shapes present in `b` but not in `a`, and the memory consequences."""
    ops_a = {op.name: op for ops in operators(a).values() for op in ops}
    ops_b = {op.name: (kind, op) for kind, ops in operators(b).items() for op in ops}
    new = [(kind, op) for name, (kind, op) in ops_b.items() if name not in ops_a]
    shapes = [
        (kind, op, ops_a[name].shape)
        for name, (kind, op) in ops_b.items()
        if name in ops_a and ops_a[name].shape != op.shape
    ]
    dropped = [(kind, op) for kind, ops in operators(a).items() for op in ops if op.name not in ops_b]
    ha, hb = parameter_counts(a)[0], parameter_counts(b)[0]
    (kva, sta), (kvb, stb) = cache_bytes(a), cache_bytes(b)
    figures = {
        "params_total": (ha["total"], hb["total"]),
        "params_active": (ha["active"], hb["active"]),
        "weight_bytes_bf16": (ha["total"] * 2, hb["total"] * 2),
        "weight_bytes_on_disk": (weight_bytes(a).disk, weight_bytes(b).disk),
        "kv_bytes_per_token": (kva, kvb),
        "state_bytes_per_sequence": (sta, stb),
        f"memory_per_sequence_at_{context}": (kva * context + sta, kvb * context + stb),
    }
    return Diff(
        a=_display_name(a), b=_display_name(b), new_operators=new, new_shapes=shapes, dropped_operators=dropped,
        memory={k: {"a": x, "b": y, "delta": y - x} for k, (x, y) in figures.items()},
    )  # fmt: skip


def _fmt_n(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return str(int(n))


def _fmt_b(n: float) -> str:
    a = abs(n)
    for unit, div in (("GiB", GiB), ("MiB", 1024**2), ("KiB", 1024)):
        if (a >= div / 10 and div > 1024) or a >= div:
            return f"{n / div:.2f} {unit}"
    return f"{int(n)} B"


def format_analysis(a: Analysis) -> str:
    """Human-readable report."""
    lines = [f"model: {a.model_type}", "layers: " + ", ".join(f"{k}={v}" for k, v in a.layers.items() if v)]
    for kind, ops in a.operators.items():
        lines.append(f"operators [{kind}]:")
        lines += [f"  - {op.name}: {op.shape}" for op in ops]
    p = a.params
    lines.append(
        f"parameters: total {_fmt_n(p['total'])} (non-embedding {_fmt_n(p['total_non_embedding'])}), "
        f"active per token {_fmt_n(p['active'])} (non-embedding {_fmt_n(p['active_non_embedding'])})"
    )
    lines.append("  by component: " + ", ".join(f"{k} {_fmt_n(v)}" for k, v in a.params_by_component.items()))
    lines.append(
        f"weights on disk: {_fmt_b(a.stored.disk)} ({a.stored.stored_as}); in memory after load: "
        f"{_fmt_b(a.stored.memory)} (bf16)"
    )
    lines.append(
        "weights at each precision: " + ", ".join(f"{k} {_fmt_b(v)}" for k, v in a.weight_bytes.items())
    )
    lines.append(f"KV per token: {a.kv_bytes_per_token} B (bf16{', MLA latent' if a.layers[MLA] else ''}"
                 f"{' + indexer keys' if a.layers['dsa'] else ''}{', GQA K+V' if a.layers[GQA] else ''})")  # fmt: skip
    lines.append(
        f"recurrent state per sequence: {_fmt_b(a.state_bytes_per_sequence)} (fp32 states + bf16 conv windows)"
    )
    lines.append(f"memory per sequence at {a.context} tokens: {_fmt_b(a.memory_per_sequence_bytes)}")
    lines += [f"note: {n}" for n in a.notes]
    lines += [f"warning: {w}" for w in a.warnings]
    if a.plan is None:
        lines.append("plan: no tensor/pipeline split of these GPU counts divides the heads and experts")
        return "\n".join(lines + _suggestion_lines(a))
    for title, plan in [("plan", a.plan)] + [("  alternative", x) for x in a.alternatives]:
        verdict = f"fits, up to {plan.max_sequences} sequences" if plan.fits else "DOES NOT FIT"
        driver = (
            f" + {_fmt_b(plan.driver_weight_bytes)} on GPU 0 (driver's vision tower)"
            if plan.driver_weight_bytes
            else ""
        )
        lines.append(
            f"{title}: {plan.gpus} GPU(s) TP={plan.tp} EP={plan.ep} PP={plan.pp} ({a.weight_dtype} weights): "
            f"weights {_fmt_b(plan.weight_bytes_per_gpu)}/GPU{driver}, KV {_fmt_b(plan.kv_bytes_per_gpu)}, state "
            f"{_fmt_b(plan.state_bytes_per_gpu)} of {_fmt_b(plan.usable_bytes_per_gpu)} usable (20% headroom): {verdict}"
        )
    if a.nodes is not None:
        lines += format_nodes(a.nodes, a.weight_dtype, a.context)
    return "\n".join(lines + _suggestion_lines(a))


def _suggestion_lines(a: Analysis) -> list[str]:
    if not a.suggestions:
        return []
    return ["to fit, change one of (the smallest change along each):"] + [f"  - {x}" for x in a.suggestions]


def format_diff(d: Diff) -> str:
    """Human-readable diff: what a Day-0 team must build to serve B given A."""
    lines = [f"diff {d.a} -> {d.b}", f"new operators in {d.b} ({len(d.new_operators)}):"]
    lines += [f"  + [{kind}] {op.name}: {op.shape}" for kind, op in d.new_operators] or ["  (none)"]
    lines.append(f"known operators with new shapes ({len(d.new_shapes)}):")
    lines += [f"  ~ [{kind}] {op.name}: {old} -> {op.shape}" for kind, op, old in d.new_shapes] or [
        "  (none)"
    ]
    lines.append(f"operators of {d.a} that {d.b} does not use ({len(d.dropped_operators)}):")
    lines += [f"  - [{kind}] {op.name}" for kind, op in d.dropped_operators] or ["  (none)"]
    lines.append("memory:")
    for k, v in d.memory.items():
        fmt = _fmt_n if k.startswith("params") else _fmt_b
        sign = "+" if v["delta"] >= 0 else "-"
        lines.append(f"  {k}: {fmt(v['a'])} -> {fmt(v['b'])} ({sign}{fmt(abs(v['delta']))})")
    return "\n".join(lines)


def to_json(x: Analysis | Diff) -> dict[str, Any]:
    """The `--json` form: plain dicts, lists and numbers."""
    return asdict(x)

"""Structure-first analysis of a model config: operators, parameters, memory and a parallel plan.

Pure Python (no torch): `dayzero analyze` answers in milliseconds on any machine, for a model
whose weights are not public yet.

Parameter conventions (all reported, the headline ones marked):

* `total`: every stored parameter of the served model (transformers' own count of the same
  config); MTP layers a checkpoint ships for speculative decoding are reported apart (`mtp`);
* `total_non_embedding`: without the input embedding table and the LM head;
* `active`: parameters a token's forward pass multiplies with: every non-routed parameter, the
  routed experts it selects (`top_k` per MoE layer) and the LM head, but not the embedding table,
  from which it reads one row (headline active).

Memory follows the runtime's cache layout: paged KV per token (MLA latent + DSA indexer key,
or GQA K and V), recurrent state per sequence (fp32 KDA/GDN states + conv windows).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from inference.config import DENSE, GDN, GQA, KDA, MLA, MOE, ModelSpec

__all__ = [
    "Analysis",
    "Diff",
    "Op",
    "ParallelPlan",
    "analyze",
    "cache_bytes",
    "diff",
    "format_analysis",
    "format_diff",
    "operators",
    "parameter_counts",
    "plan_parallel",
]

GiB = 1024**3
HEADROOM = 0.20  # fraction of each GPU kept free (activations, fragmentation, CUDA context)
# bytes per weight; int4 counts its group scales (one bf16 scale per 32 weights, the K2.5 layout)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "int4": 0.5 + 2 / 32, "fp4": 0.5}
KV_DTYPE_BYTES = 2  # bf16 KV and conv windows, as the engine allocates them
STATE_DTYPE_BYTES = 4  # recurrent states stay fp32


@dataclass(frozen=True, slots=True)
class Op:
    """One operator a layer kind needs, with the shape a kernel is written or tuned for."""

    name: str
    shape: str


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """One replica over `tp * pp` GPUs; routed experts split `ep` ways over the TP group (ep == tp)."""

    gpus: int
    tp: int
    ep: int
    pp: int
    weight_bytes_per_gpu: float
    kv_bytes_per_gpu: float
    state_bytes_per_gpu: float
    usable_bytes_per_gpu: float
    fits: bool
    max_sequences: int
    note: str = ""


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
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    context: int
    memory_per_sequence_bytes: int
    plan: ParallelPlan | None = None
    alternatives: list[ParallelPlan] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------- parameters


def _kda_params(s: ModelSpec) -> int:
    k, h = s.kda, s.hidden_size
    d = k.proj_dim
    return (
        3 * h * d  # q, k, v
        + 3 * d * k.conv_kernel_size  # short convs
        + k.num_heads + d  # A_log, dt_bias
        + 2 * (h * k.head_dim + k.head_dim * d)  # f_a/f_b and g_a/g_b low-rank
        + h * k.num_heads  # b_proj
        + k.head_dim  # o_norm
        + d * h  # o_proj
    )  # fmt: skip


def _mla_params(s: ModelSpec) -> int:
    m, h = s.mla, s.hidden_size
    q = h * m.num_heads * m.qk_head_dim
    if m.q_lora_rank is not None:
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * m.num_heads * m.qk_head_dim
    kv = (
        h * m.latent_dim + m.kv_lora_rank + m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim)
    )
    total = q + kv + m.num_heads * m.v_head_dim * h
    if s.dsa is not None and m.q_lora_rank is not None:
        d = s.dsa  # wq_b, wk, k_norm (LayerNorm: weight + bias), weights_proj
        total += m.q_lora_rank * d.num_heads * d.head_dim + h * d.head_dim + 2 * d.head_dim + h * d.num_heads
    return total


def _gdn_params(s: ModelSpec) -> int:
    g, h = s.gdn, s.hidden_size
    return (
        h * (2 * g.key_dim + 2 * g.value_dim)  # in_proj_qkvz
        + h * 2 * g.num_v_heads  # in_proj_ba
        + g.conv_dim * g.conv_kernel_size  # depthwise conv, no bias
        + 2 * g.num_v_heads  # dt_bias, A_log
        + g.v_head_dim  # gated RMSNorm
        + g.value_dim * h  # out_proj
    )  # fmt: skip


def _gqa_params(s: ModelSpec) -> int:
    a, h = s.gqa, s.hidden_size
    q_out = a.num_heads * a.head_dim * (2 if a.output_gate else 1)  # query and gate in one projection
    return h * q_out + 2 * h * a.num_kv_heads * a.head_dim + a.num_heads * a.head_dim * h + 2 * a.head_dim


_MIXER_PARAMS = {KDA: _kda_params, MLA: _mla_params, GDN: _gdn_params, GQA: _gqa_params}


def _moe_layer_params(s: ModelSpec) -> tuple[int, int, int, int]:
    """(router, shared, routed, routed active) parameters of one MoE layer."""
    e, h = s.moe, s.hidden_size
    expert = 3 * h * e.intermediate_size
    router = e.num_experts * h + (e.num_experts if e.scoring == "sigmoid" else 0)  # + correction bias
    shared = 3 * h * e.shared_width + (h if e.shared_expert_gate else 0)
    return router, shared, expert * e.num_experts, expert * e.top_k


def _layer_params(s: ModelSpec, i: int) -> int:
    """One decoder layer: mixer, FFN and its two norms."""
    n = _MIXER_PARAMS[s.layer_kinds[i]](s) + 2 * s.hidden_size
    if s.mlp_kinds[i] == MOE:
        return n + sum(_moe_layer_params(s)[:3])
    return n + 3 * s.hidden_size * s.intermediate_size


def parameter_counts(s: ModelSpec) -> tuple[dict[str, int], dict[str, int]]:
    """(headline counts, counts per component) of the text model plus the vision tower."""
    h = s.hidden_size
    comp = {"embedding": s.vocab_size * h, "lm_head": 0 if s.tie_word_embeddings else s.vocab_size * h}
    comp["norms"] = h * (2 * s.num_layers + 1)
    for kind, fn in _MIXER_PARAMS.items():
        if kind in s.layer_kinds:
            comp[kind] = fn(s) * s.layer_kinds.count(kind)
    comp["dense_mlp"] = 3 * h * s.intermediate_size * s.mlp_kinds.count(DENSE)
    n_moe = s.mlp_kinds.count(MOE)
    routed_active = 0
    if s.moe is not None and n_moe:
        router, shared, routed, active = _moe_layer_params(s)
        comp["router"] = router * n_moe
        comp["shared_experts"] = shared * n_moe
        comp["routed_experts"] = routed * n_moe
        routed_active = active * n_moe
    if s.vision is not None:
        v = s.vision
        block = 4 * v.hidden_size + 4 * v.hidden_size**2 + 4 * v.hidden_size  # norms, wqkv, wo
        block += 2 * v.hidden_size * v.intermediate_size + v.intermediate_size + v.hidden_size
        comp["vision_tower"] = (
            3 * v.patch_size**2 * v.hidden_size + v.hidden_size
            + v.pos_emb_height * v.pos_emb_width * v.hidden_size
            + v.num_layers * block + 2 * v.hidden_size
        )  # fmt: skip
        comp["mm_projector"] = 2 * v.hidden_size + v.merged_dim**2 + v.merged_dim + v.merged_dim * h + h
    total = sum(comp.values())
    non_emb = total - comp["embedding"] - comp["lm_head"]
    active = total - comp["embedding"] - comp.get("routed_experts", 0) + routed_active
    active -= comp.get("vision_tower", 0) + comp.get("mm_projector", 0)  # text tokens only
    head = {
        "total": total,
        "total_non_embedding": non_emb,
        "active": active,
        "active_non_embedding": active - comp["lm_head"],
    }
    if s.mtp is not None:
        # DeepSeek-V3 MTP module: enorm, hnorm, eh_proj (2h -> h), one MoE decoder layer, its head norm;
        # embedding and LM head are the main model's (the checkpoint stores copies of them)
        head["mtp"] = s.mtp.num_layers * (3 * h + 2 * h * h + _layer_params(s, s.num_layers - 1))
    return head, comp


# ---------------------------------------------------------------------------------- cache bytes


def _kv_per_layer(s: ModelSpec, kind: str, dtype_bytes: int) -> int:
    if kind == MLA:
        return (s.mla.latent_dim + (s.dsa.head_dim if s.dsa else 0)) * dtype_bytes
    if kind == GQA:
        return 2 * s.gqa.num_kv_heads * s.gqa.head_dim * dtype_bytes
    return 0


def _state_per_layer(s: ModelSpec, kind: str, dtype_bytes: int) -> int:
    if kind == KDA:
        k = s.kda
        return (
            k.num_heads * k.head_dim**2 * STATE_DTYPE_BYTES
            + 3 * k.proj_dim * (k.conv_kernel_size - 1) * dtype_bytes
        )
    if kind == GDN:
        g = s.gdn
        state = g.num_v_heads * g.k_head_dim * g.v_head_dim * STATE_DTYPE_BYTES
        return state + g.conv_dim * (g.conv_kernel_size - 1) * dtype_bytes
    return 0


def cache_bytes(s: ModelSpec, kv_dtype_bytes: int = KV_DTYPE_BYTES) -> tuple[int, int]:
    """(KV bytes per token, recurrent-state bytes per sequence), over all layers."""
    kv = sum(_kv_per_layer(s, kind, kv_dtype_bytes) for kind in s.layer_kinds)
    state = sum(_state_per_layer(s, kind, kv_dtype_bytes) for kind in s.layer_kinds)
    return kv, state


# ---------------------------------------------------------------------------------- operators


def _kda_ops(s: ModelSpec) -> list[Op]:
    k, h = s.kda, s.hidden_size
    return [
        Op("KDA q/k/v projection", f"GEMM {h}->{k.proj_dim} x3"),
        Op("short causal depthwise conv + SiLU", f"k={k.conv_kernel_size}, {3 * k.proj_dim} channels"),
        Op("KDA per-channel decay gate", f"{h}->{k.head_dim}->{k.proj_dim}, -exp(A_log)*softplus(.+dt_bias)"),
        Op("delta-rule beta", f"{h}->{k.num_heads}, sigmoid"),
        Op(
            "KDA gated delta rule (chunk prefill / recurrent decode)",
            f"{k.num_heads} heads, state {k.head_dim}x{k.head_dim} fp32, per-channel decay",
        ),
        Op("output gate + gated RMSNorm", f"{h}->{k.head_dim}->{k.proj_dim}, norm over {k.head_dim}"),
        Op("KDA output projection", f"GEMM {k.proj_dim}->{h}"),
    ]


def _mla_ops(s: ModelSpec) -> list[Op]:
    m, h = s.mla, s.hidden_size
    q = (
        f"{h}->{m.q_lora_rank}->RMSNorm->{m.num_heads}x{m.qk_head_dim}"
        if m.q_lora_rank
        else f"{h}->{m.num_heads}x{m.qk_head_dim}"
    )
    ops = [
        Op("MLA q projection", q),
        Op("MLA kv_a projection + latent RMSNorm", f"{h}->{m.kv_lora_rank}+{m.qk_rope_head_dim}"),
        Op(
            "MLA rope on q_pe and the shared key",
            f"interleaved, {m.qk_rope_head_dim} dims" if m.use_rope else "none (NoPE)",
        ),
        Op("paged latent KV write", f"{m.latent_dim} per token"),
        Op(
            "MLA prefill attention (kv_b expand, causal)",
            f"{m.kv_lora_rank}->{m.num_heads}x({m.qk_nope_head_dim}+{m.v_head_dim}), qk {m.qk_head_dim}",
        ),
        Op(
            "MLA absorbed decode attention",
            f"{m.num_heads} heads over {m.latent_dim}-wide latents, out {m.kv_lora_rank}->{m.v_head_dim}",
        ),
        Op("MLA output projection", f"GEMM {m.num_heads * m.v_head_dim}->{h}"),
    ]
    if m.rope_scaling is not None:
        ops.append(Op("YaRN rope scaling", ", ".join(f"{k}={v}" for k, v in m.rope_scaling)))
    if s.dsa is not None:
        d = s.dsa
        ops += [
            Op(
                "DSA lightning indexer",
                f"{d.num_heads} heads x {d.head_dim} from q_lora {m.q_lora_rank}, ReLU, weighted",
            ),
            Op("paged indexer key write", f"{d.head_dim} per token, LayerNorm'd"),
            Op("DSA top-k select + sparse MLA attention", f"top-{d.topk} keys per query"),
        ]
    return ops


def _gdn_ops(s: ModelSpec) -> list[Op]:
    g, h = s.gdn, s.hidden_size
    return [
        Op(
            "GDN in_proj_qkvz + in_proj_ba",
            f"GEMM {h}->{2 * g.key_dim + 2 * g.value_dim} and {h}->{2 * g.num_v_heads}",
        ),
        Op("short causal depthwise conv + SiLU", f"k={g.conv_kernel_size}, {g.conv_dim} channels"),
        Op("GDN scalar decay gate", f"{g.num_v_heads} heads, -exp(A_log)*softplus(a+dt_bias)"),
        Op("delta-rule beta", f"{h}->{g.num_v_heads}, sigmoid"),
        Op(
            "gated delta rule (chunk prefill / recurrent decode)",
            f"{g.num_k_heads} qk heads shared by {g.num_v_heads} v heads, state {g.k_head_dim}x{g.v_head_dim} fp32, "
            "scalar decay per head",
        ),
        Op("output gate + gated RMSNorm", f"z gate {g.value_dim}, norm over {g.v_head_dim}"),
        Op("GDN output projection", f"GEMM {g.value_dim}->{h}"),
    ]


def _gqa_ops(s: ModelSpec) -> list[Op]:
    a, h = s.gqa, s.hidden_size
    return [
        Op(
            "GQA q(+gate)/k/v projection",
            f"{h}->{a.num_heads}x{a.head_dim}x2 | {a.num_kv_heads}x{a.head_dim} x2",
        ),
        Op("q/k RMSNorm per head (zero-centred)", f"{a.head_dim}"),
        Op("partial rope (half-split)", f"{a.rotary_dim} of {a.head_dim} dims, theta {a.rope_theta:g}"),
        Op("paged GQA KV write", f"{a.num_kv_heads} heads x {a.head_dim} K and V per token"),
        Op(
            "GQA causal attention (prefill + paged decode)",
            f"{a.num_heads} q heads / {a.num_kv_heads} kv heads, d {a.head_dim}",
        ),
        Op("sigmoid output gate", f"{a.num_heads}x{a.head_dim}"),
        Op("GQA output projection", f"GEMM {a.num_heads * a.head_dim}->{h}"),
    ]


def operators(s: ModelSpec) -> dict[str, list[Op]]:
    """Operator inventory per layer kind present, with the shapes that matter for kernels."""
    h = s.hidden_size
    builders = {KDA: _kda_ops, MLA: _mla_ops, GDN: _gdn_ops, GQA: _gqa_ops}
    ops = {kind: fn(s) for kind, fn in builders.items() if kind in s.layer_kinds}
    norm = "zero-centred RMSNorm (1 + w)" if s.model_type == "qwen3_next" else "RMSNorm"
    ops["norms"] = [Op(norm, f"{h}, eps {s.rms_norm_eps:g}")]
    if DENSE in s.mlp_kinds:
        ops["dense_mlp"] = [Op("SwiGLU MLP", f"{h}->{s.intermediate_size}->{h}")]
    if s.moe is not None and MOE in s.mlp_kinds:
        e = s.moe
        if e.scoring == "sigmoid":
            route = f"{h}->{e.num_experts}, sigmoid, bias-corrected top-{e.top_k}"
            if e.num_groups > 1:
                route += f" in {e.topk_groups} of {e.num_groups} groups"
            route += f", scale {e.routed_scaling_factor:g}"
        else:
            route = f"{h}->{e.num_experts}, softmax top-{e.top_k}" + (
                ", renormalised" if e.renormalize else ""
            )
        ops["moe"] = [
            Op(f"MoE router ({e.scoring})", route),
            Op("routed SwiGLU experts (grouped GEMM)", f"{e.num_experts} x {h}->{e.intermediate_size}->{h}"),
            Op(
                "shared expert SwiGLU" + (" with sigmoid gate" if e.shared_expert_gate else ""),
                f"{h}->{e.shared_width}->{h}",
            ),
        ]
    if s.vision is not None:
        v = s.vision
        ops["vision"] = [
            Op(
                "patch embed conv + position grid",
                f"{v.patch_size}x{v.patch_size} -> {v.hidden_size}, bicubic-resized",
            ),
            Op(
                "ViT block (2D rope, GELU-tanh MLP)",
                f"{v.num_layers} x {v.num_heads} heads, MLP {v.intermediate_size}",
            ),
            Op(
                "patch merge + projector",
                f"{v.merge_kernel[0]}x{v.merge_kernel[1]}, {v.merged_dim}->GELU->{h}",
            ),
        ]
    if s.mtp is not None:
        ops["mtp"] = [
            Op("MTP module (not served)", f"{s.mtp.num_layers} x (eh_proj {2 * h}->{h} + decoder layer)")
        ]
    return ops


# ---------------------------------------------------------------------------------- parallel plan


def _split_problem(s: ModelSpec, tp: int) -> str:
    """Why TP=`tp` does not split this model evenly ("" when it does)."""
    heads = []
    if s.kda is not None and KDA in s.layer_kinds:
        heads.append(("KDA heads", s.kda.num_heads))
    if s.mla is not None and MLA in s.layer_kinds:
        heads.append(("MLA heads", s.mla.num_heads))
    if s.gdn is not None and GDN in s.layer_kinds:
        heads += [("GDN key heads", s.gdn.num_k_heads), ("GDN value heads", s.gdn.num_v_heads)]
    if s.gqa is not None and GQA in s.layer_kinds:
        heads.append(("GQA heads", s.gqa.num_heads))
        kv = s.gqa.num_kv_heads
        if kv % tp and tp % kv:  # fewer kv heads than ranks is fine: each rank keeps a replica
            return f"GQA kv heads {kv} vs TP {tp}"
    if s.moe is not None:
        heads.append(("experts", s.moe.num_experts))
    for what, n in heads:
        if n % tp:
            return f"{what} {n} not divisible by TP {tp}"
    return ""


def _kv_per_gpu(s: ModelSpec, tp: int) -> int:
    """KV bytes per token on one rank: the MLA latent and indexer keys are shared by all heads, so
    every TP rank keeps them whole; GQA K/V split by kv head (replicated past num_kv_heads)."""
    total = 0
    for kind in s.layer_kinds:
        per = _kv_per_layer(s, kind, KV_DTYPE_BYTES)
        total += per / min(tp, s.gqa.num_kv_heads) if kind == GQA else per
    return math.ceil(total)


def plan_parallel(
    s: ModelSpec, gpus: int, gpu_mem_gib: float, context: int, weight_dtype: str = "bf16", sequences: int = 1
) -> list[ParallelPlan]:
    """Every (tp, pp) with tp * pp == gpus that splits cleanly, best first (fits, fewer stages, room).

    TP splits attention heads and FFN columns, EP (== tp) splits routed experts, PP splits layers.
    Weights are taken as evenly split (replicated norms and routers are < 0.1% of a large model).
    """
    head, _ = parameter_counts(s)
    wb = WEIGHT_BYTES[weight_dtype]
    _, state_seq = cache_bytes(s)
    usable = gpu_mem_gib * GiB * (1 - HEADROOM)
    plans = []
    for tp in (t for t in range(1, gpus + 1) if gpus % t == 0):
        pp = gpus // tp
        if pp > s.num_layers or _split_problem(s, tp):
            continue
        w = head["total"] * wb / (tp * pp)
        kv = _kv_per_gpu(s, tp) * context / pp
        st = state_seq / (tp * pp)
        per_seq = kv + st
        free = usable - w
        n = max(0, math.floor(free / per_seq)) if per_seq else (sequences if free > 0 else 0)
        plans.append(
            ParallelPlan(
                gpus=gpus, tp=tp, ep=tp, pp=pp, weight_bytes_per_gpu=w, kv_bytes_per_gpu=kv * sequences,
                state_bytes_per_gpu=st * sequences, usable_bytes_per_gpu=usable, fits=n >= sequences,
                max_sequences=n, note="" if n >= sequences else "does not fit",
            )
        )  # fmt: skip
    return sorted(plans, key=lambda p: (not p.fits, p.pp, -p.max_sequences))


def _gpu_counts(limit: int) -> list[int]:
    """Candidate replica sizes up to `limit`: powers of two, and `limit` itself."""
    counts = [n for n in (2**i for i in range(12)) if n <= limit]
    return counts + ([limit] if limit not in counts else [])


def analyze(
    s: ModelSpec,
    *,
    gpus: int | None = None,
    gpu_mem_gib: float = 80.0,
    context: int = 131072,
    weight_dtype: str | None = None,
    sequences: int = 1,
) -> Analysis:
    """Analyse `s` and plan the fewest GPUs (up to `gpus`, default 1024) that hold it with 20% headroom.

    `weight_dtype` defaults to the checkpoint's own format (fp8 / int4 when it is quantized, else bf16).
    """
    weight_dtype = weight_dtype or s.quantization or "bf16"
    if weight_dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight dtype must be one of {sorted(WEIGHT_BYTES)}, got {weight_dtype!r}")
    for name, value in (("gpus", gpus), ("context", context), ("sequences", sequences)):
        if value is not None and value <= 0:
            raise ValueError(f"{name} must be positive, got {value}")
    head, comp = parameter_counts(s)
    kv_tok, state_seq = cache_bytes(s)
    plans: list[ParallelPlan] = []
    for n in _gpu_counts(gpus or 1024):
        plans = plan_parallel(s, n, gpu_mem_gib, context, weight_dtype, sequences)
        if plans and plans[0].fits:
            break
    notes = []
    if s.mtp is not None:
        notes.append(
            f"{s.mtp.num_layers} MTP layer(s) in the checkpoint ({head['mtp'] / 1e9:.2f}B), not served"
        )
    if s.mla is not None and s.mla.rope_scaling is not None:
        notes.append("YaRN rope scaling: read here, refused by the model code (not implemented)")
    if s.quantization:
        notes.append(f"checkpoint weights stored as {s.quantization}")
    return Analysis(
        model_type=s.model_type if s.wrapper_type is None else f"{s.wrapper_type}({s.model_type})",
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
        kv_bytes_per_token=kv_tok,
        state_bytes_per_sequence=state_seq,
        context=context,
        memory_per_sequence_bytes=kv_tok * context + state_seq,
        plan=plans[0] if plans else None,
        alternatives=plans[1:4],
        notes=notes,
    )


# ---------------------------------------------------------------------------------- diff


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
        "kv_bytes_per_token": (kva, kvb),
        "state_bytes_per_sequence": (sta, stb),
        f"memory_per_sequence_at_{context}": (kva * context + sta, kvb * context + stb),
    }
    name = lambda s: s.model_type if s.wrapper_type is None else f"{s.wrapper_type}({s.model_type})"  # noqa: E731
    return Diff(
        a=name(a), b=name(b), new_operators=new, new_shapes=shapes, dropped_operators=dropped,
        memory={k: {"a": x, "b": y, "delta": y - x} for k, (x, y) in figures.items()},
    )  # fmt: skip


# ---------------------------------------------------------------------------------- output


def _fmt_n(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return str(int(n))


def _fmt_b(n: float) -> str:
    a = abs(n)
    return f"{n / GiB:.2f} GiB" if a >= GiB / 10 else f"{n / 1024**2:.2f} MiB" if a >= 1024 else f"{int(n)} B"


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
    lines.append("weights: " + ", ".join(f"{k} {_fmt_b(v)}" for k, v in a.weight_bytes.items()))
    lines.append(f"KV per token: {a.kv_bytes_per_token} B (bf16{', MLA latent' if a.layers[MLA] else ''}"
                 f"{' + indexer keys' if a.layers['dsa'] else ''}{', GQA K+V' if a.layers[GQA] else ''})")  # fmt: skip
    lines.append(
        f"recurrent state per sequence: {_fmt_b(a.state_bytes_per_sequence)} (fp32 states + bf16 conv windows)"
    )
    lines.append(f"memory per sequence at {a.context} tokens: {_fmt_b(a.memory_per_sequence_bytes)}")
    lines += [f"note: {n}" for n in a.notes]
    if a.plan is None:
        lines.append("plan: no tensor/pipeline split of these GPU counts divides the heads and experts")
        return "\n".join(lines)
    for title, plan in [("plan", a.plan)] + [("  alternative", x) for x in a.alternatives]:
        verdict = f"fits, up to {plan.max_sequences} sequences" if plan.fits else "DOES NOT FIT"
        lines.append(
            f"{title}: {plan.gpus} GPU(s) TP={plan.tp} EP={plan.ep} PP={plan.pp} ({a.weight_dtype} weights): "
            f"weights {_fmt_b(plan.weight_bytes_per_gpu)}/GPU, KV {_fmt_b(plan.kv_bytes_per_gpu)}, state "
            f"{_fmt_b(plan.state_bytes_per_gpu)} of {_fmt_b(plan.usable_bytes_per_gpu)} usable (20% headroom): {verdict}"
        )
    return "\n".join(lines)


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

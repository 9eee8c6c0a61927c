"""Structure-first analysis of a model config: operators, parameters, memory and a parallel plan.

Pure Python (no torch): `dayzero analyze` answers in milliseconds on any machine.

Parameter conventions (all reported, the headline ones marked):

* `total`: every stored parameter; `total_non_embedding`: without the input embedding table and
  the LM head (headline total, the convention model names like "48B" follow);
* `active`: parameters a token's forward pass multiplies with: every non-routed parameter, the
  routed experts it selects (`top_k` per MoE layer) and the LM head, but not the embedding table,
  from which it reads one row (headline active).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from inference.config import DENSE, KDA, MLA, MOE, ModelSpec

__all__ = ["Analysis", "ParallelPlan", "analyze", "format_analysis", "plan_parallel"]

GiB = 1024**3
HEADROOM = 0.20  # fraction of each GPU kept free (activations, fragmentation, CUDA context)
WEIGHT_BYTES = {"bf16": 2.0, "fp8": 1.0, "fp4": 0.5}


@dataclass(frozen=True, slots=True)
class ParallelPlan:
    """One replica of the model over `tp * pp` GPUs; routed experts split `ep` ways (ep == tp)."""

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

    layers: dict[str, int]
    operators: dict[str, list[str]]
    params: dict[str, int]
    params_by_component: dict[str, int]
    weight_bytes: dict[str, float]
    kv_bytes_per_token: int
    state_bytes_per_sequence: int
    context: int
    memory_per_sequence_bytes: int
    plan: ParallelPlan | None = None
    alternatives: list[ParallelPlan] = field(default_factory=list)


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
        d = s.dsa
        total += m.q_lora_rank * d.num_heads * d.head_dim + h * d.head_dim + 2 * d.head_dim + h * d.num_heads
    return total


def parameter_counts(s: ModelSpec) -> tuple[dict[str, int], dict[str, int]]:
    """(headline counts, counts per component) of the text model plus the vision tower."""
    h = s.hidden_size
    comp = {"embedding": s.vocab_size * h, "lm_head": 0 if s.tie_word_embeddings else s.vocab_size * h}
    comp["norms"] = h * (2 * s.num_layers + 1)
    comp["kda"] = _kda_params(s) * s.layer_kinds.count(KDA)
    comp["mla"] = _mla_params(s) * s.layer_kinds.count(MLA)
    comp["dense_mlp"] = 3 * h * s.intermediate_size * s.mlp_kinds.count(DENSE)
    n_moe = s.mlp_kinds.count(MOE)
    routed_active = 0
    if s.moe is not None and n_moe:
        e = s.moe
        expert = 3 * h * e.intermediate_size
        comp["router"] = (e.num_experts * h + e.num_experts) * n_moe
        comp["shared_experts"] = expert * e.num_shared_experts * n_moe
        comp["routed_experts"] = expert * e.num_experts * n_moe
        routed_active = expert * e.top_k * n_moe
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
    return head, comp


def cache_bytes(s: ModelSpec, kv_dtype_bytes: int = 2) -> tuple[int, int]:
    """(MLA KV bytes per token, KDA state bytes per sequence), as `HybridCacheSpec` allocates them."""
    per_tok = (s.mla.latent_dim + (s.dsa.head_dim if s.dsa else 0)) * kv_dtype_bytes * len(s.mla_layers)
    k = s.kda
    state = (
        k.num_heads * k.head_dim * k.head_dim * 4 + 3 * k.proj_dim * (k.conv_kernel_size - 1) * kv_dtype_bytes
    )
    return per_tok, state * len(s.kda_layers)


def operators(s: ModelSpec) -> dict[str, list[str]]:
    """Operator inventory per layer type, with the shapes that matter for kernels."""
    k, m, h = s.kda, s.mla, s.hidden_size
    ops = {
        "kda": [
            f"q/k/v proj GEMM {h}->{k.proj_dim} x3",
            f"short causal depthwise conv k={k.conv_kernel_size} + SiLU on {3 * k.proj_dim} channels",
            f"decay gate f_a/f_b {h}->{k.head_dim}->{k.proj_dim}, -exp(A_log)*softplus(.+dt_bias)",
            f"beta proj {h}->{k.num_heads} + sigmoid",
            f"gated delta rule, {k.num_heads} heads, state {k.head_dim}x{k.head_dim} fp32 "
            "(chunk_kda prefill / fused_recurrent_kda decode)",
            f"output gate g_a/g_b {h}->{k.head_dim}->{k.proj_dim}, gated RMSNorm({k.head_dim})",
            f"o_proj GEMM {k.proj_dim}->{h}",
        ],
        "mla": [
            f"q proj {h}->{m.num_heads}x{m.qk_head_dim}"
            + (f" via q_lora {m.q_lora_rank}" if m.q_lora_rank else ""),
            f"kv_a proj {h}->{m.kv_lora_rank}+{m.qk_rope_head_dim}, RMSNorm({m.kv_lora_rank})",
            f"paged latent KV write ({m.latent_dim} per token)",
            f"prefill: kv_b expand {m.kv_lora_rank}->{m.num_heads}x({m.qk_nope_head_dim}+{m.v_head_dim}), causal attention",
            f"decode: absorbed attention in latent space (q_nope@W_UK, softmax over {m.latent_dim}-wide keys, @W_UV)",
            "rope: " + ("interleaved on the shared rope key" if m.use_rope else "none (NoPE)"),
            f"o_proj GEMM {m.num_heads * m.v_head_dim}->{h}",
        ],
    }
    if s.dsa is not None:
        d = s.dsa
        ops["mla"].insert(
            3,
            f"DSA lightning indexer: {d.num_heads} heads x {d.head_dim}, ReLU scores, top-{d.topk} keys per query "
            "-> sparse attention over the selected latents",
        )
    ops["dense_mlp"] = [f"SwiGLU {h}->{s.intermediate_size}->{h}"]
    if s.moe is not None:
        e = s.moe
        ops["moe"] = [
            f"router GEMM {h}->{e.num_experts}, sigmoid, bias-corrected grouped top-{e.top_k} "
            f"({e.num_groups} groups, keep {e.topk_groups}), routed scale {e.routed_scaling_factor}",
            f"{e.num_experts} routed SwiGLU experts {h}->{e.intermediate_size}->{h}",
            f"{e.num_shared_experts} shared expert(s) SwiGLU {h}->{e.intermediate_size * e.num_shared_experts}->{h}",
        ]
    if s.vision is not None:
        v = s.vision
        ops["vision"] = [
            f"patch embed conv {v.patch_size}x{v.patch_size} -> {v.hidden_size} + bicubic-resized position grid",
            f"{v.num_layers} x bidirectional block (2D rope, {v.num_heads} heads, GELU-tanh MLP {v.intermediate_size})",
            f"{v.merge_kernel[0]}x{v.merge_kernel[1]} patch merge, projector LN -> {v.merged_dim}->GELU->{h}",
        ]
    return ops


def _split_ok(s: ModelSpec, tp: int) -> bool:
    heads_ok = s.kda.num_heads % tp == 0 and s.mla.num_heads % tp == 0
    experts_ok = s.moe is None or s.moe.num_experts % tp == 0
    return heads_ok and experts_ok


def plan_parallel(
    s: ModelSpec, gpus: int, gpu_mem_gib: float, context: int, weight_dtype: str = "bf16", sequences: int = 1
) -> list[ParallelPlan]:
    """Every (tp, pp) with tp * pp == gpus that splits cleanly, best first (fits, then most sequences).

    TP splits attention heads and FFN columns, EP (== tp) splits routed experts, PP splits layers;
    the MLA latent KV is shared by all heads, so every TP rank keeps a full copy of its stage's.
    """
    head, _ = parameter_counts(s)
    wb = WEIGHT_BYTES[weight_dtype]
    kv_tok, state_seq = cache_bytes(s)
    usable = gpu_mem_gib * GiB * (1 - HEADROOM)
    plans = []
    for tp in (t for t in range(1, gpus + 1) if gpus % t == 0):
        pp = gpus // tp
        if pp > s.num_layers or not _split_ok(s, tp):
            continue
        # every weight is split tp ways: heads/columns (TP), routed experts (EP == TP), vocab rows
        w = head["total"] / tp * wb / pp
        kv = kv_tok * context / pp
        st = state_seq / (tp * pp)
        per_seq = kv + st
        free = usable - w
        n = max(0, math.floor(free / per_seq)) if per_seq else 0
        plans.append(
            ParallelPlan(
                gpus=gpus,
                tp=tp,
                ep=tp,
                pp=pp,
                weight_bytes_per_gpu=w,
                kv_bytes_per_gpu=kv * sequences,
                state_bytes_per_gpu=st * sequences,
                usable_bytes_per_gpu=usable,
                fits=n >= sequences,
                max_sequences=n,
                note="" if n >= sequences else "does not fit",
            )
        )
    # prefer plans that fit, then fewer pipeline stages (less bubble), then more room
    return sorted(plans, key=lambda p: (not p.fits, p.pp, -p.max_sequences))


def analyze(
    s: ModelSpec,
    *,
    gpus: int | None = None,
    gpu_mem_gib: float = 80.0,
    context: int = 131072,
    weight_dtype: str = "bf16",
    sequences: int = 1,
) -> Analysis:
    """Analyse `s`; with `gpus` plan for that count, else find the smallest power of two that fits."""
    if weight_dtype not in WEIGHT_BYTES:
        raise ValueError(f"weight dtype must be one of {sorted(WEIGHT_BYTES)}, got {weight_dtype!r}")
    head, comp = parameter_counts(s)
    kv_tok, state_seq = cache_bytes(s)
    plans: list[ParallelPlan] = []
    if gpus is not None:
        plans = plan_parallel(s, gpus, gpu_mem_gib, context, weight_dtype, sequences)
    else:
        n = 1
        while n <= 1024:
            plans = plan_parallel(s, n, gpu_mem_gib, context, weight_dtype, sequences)
            if plans and plans[0].fits:
                break
            n *= 2
    return Analysis(
        layers={
            "kda": s.layer_kinds.count(KDA),
            "mla": s.layer_kinds.count(MLA),
            "dense_mlp": s.mlp_kinds.count(DENSE),
            "moe": s.mlp_kinds.count(MOE),
            "dsa": s.layer_kinds.count(MLA) if s.dsa else 0,
        },
        operators=operators(s),
        params=head,
        params_by_component=comp,
        weight_bytes={k: head["total"] * v for k, v in WEIGHT_BYTES.items()},
        kv_bytes_per_token=kv_tok,
        state_bytes_per_sequence=state_seq,
        context=context,
        memory_per_sequence_bytes=kv_tok * context + state_seq,
        plan=plans[0] if plans else None,
        alternatives=plans[1:4],
    )


def _fmt_n(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= div:
            return f"{n / div:.3f}{unit}"
    return str(int(n))


def _fmt_b(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if n >= GiB / 10 else f"{n / 1024**2:.2f} MiB" if n >= 1024 else f"{int(n)} B"


def format_analysis(a: Analysis) -> str:
    """Human-readable report."""
    lines = ["layers: " + ", ".join(f"{k}={v}" for k, v in a.layers.items())]
    for kind, ops in a.operators.items():
        lines.append(f"operators [{kind}]:")
        lines += [f"  - {op}" for op in ops]
    p = a.params
    lines.append(
        f"parameters: total {_fmt_n(p['total'])} (non-embedding {_fmt_n(p['total_non_embedding'])}), "
        f"active per token {_fmt_n(p['active'])} (non-embedding {_fmt_n(p['active_non_embedding'])})"
    )
    lines.append("  by component: " + ", ".join(f"{k} {_fmt_n(v)}" for k, v in a.params_by_component.items()))
    lines.append("weights: " + ", ".join(f"{k} {_fmt_b(v)}" for k, v in a.weight_bytes.items()))
    lines.append(
        f"MLA KV per token: {a.kv_bytes_per_token} B (bf16 latent{' + indexer keys' if a.layers['dsa'] else ''})"
    )
    lines.append(
        f"KDA state per sequence: {_fmt_b(a.state_bytes_per_sequence)} (fp32 state + bf16 conv windows)"
    )
    lines.append(f"memory per sequence at {a.context} tokens: {_fmt_b(a.memory_per_sequence_bytes)}")
    if a.plan is None:
        lines.append("plan: no tensor/pipeline split of this GPU count divides the heads and experts")
        return "\n".join(lines)
    for title, plan in [("plan", a.plan)] + [("  alternative", x) for x in a.alternatives]:
        verdict = f"fits, up to {plan.max_sequences} sequences" if plan.fits else "DOES NOT FIT"
        lines.append(
            f"{title}: {plan.gpus} GPU(s) TP={plan.tp} EP={plan.ep} PP={plan.pp}: weights "
            f"{_fmt_b(plan.weight_bytes_per_gpu)}/GPU, KV {_fmt_b(plan.kv_bytes_per_gpu)}, state "
            f"{_fmt_b(plan.state_bytes_per_gpu)} of {_fmt_b(plan.usable_bytes_per_gpu)} usable (20% headroom): {verdict}"
        )
    return "\n".join(lines)


def to_json(a: Analysis) -> dict[str, Any]:
    """The `--json` form: plain dicts, lists and numbers."""
    return asdict(a)

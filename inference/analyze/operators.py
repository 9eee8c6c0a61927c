"""Operator inventory per layer kind, with the shapes a kernel is written or tuned for."""

from __future__ import annotations

from dataclasses import dataclass

from inference.config import DENSE, GDN, GQA, KDA, MLA, MOE, ModelSpec

__all__ = ["Op", "operators"]


@dataclass(frozen=True, slots=True)
class Op:
    """One operator a layer kind needs, with the shape a kernel is written or tuned for."""

    name: str
    shape: str


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

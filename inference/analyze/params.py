"""Parameter counts and cache bytes of a spec, as the served model and the runtime's cache hold them.

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

from inference.cache.spec import STATE_DTYPE_BYTES, HybridCacheSpec
from inference.config import DENSE, GDN, GQA, KDA, MLA, MOE, ModelSpec

__all__ = [
    "KV_DTYPE_BYTES",
    "STATE_DTYPE_BYTES",
    "cache_bytes",
    "dsa_params",
    "kv_per_layer",
    "layer_params",
    "mixer_param_numels",
    "mixer_params",
    "moe_layer_params",
    "parameter_counts",
    "state_per_layer",
]

KV_DTYPE_BYTES = 2  # bf16 KV and conv windows, as the engine allocates them


def _kda_params(s: ModelSpec) -> dict[str, int]:
    k, h = s.kda, s.hidden_size
    d = k.proj_dim
    return {
        **{f"{p}.weight": h * d for p in ("q_proj", "k_proj", "v_proj")},
        **{
            f"{p}.weight": d * k.conv_kernel_size for p in ("q_conv1d", "k_conv1d", "v_conv1d")
        },  # short convs
        "A_log": k.num_heads,
        "dt_bias": d,
        **{f"{p}_a_proj.weight": h * k.head_dim for p in ("f", "g")},  # low-rank gate inputs
        **{f"{p}_b_proj.weight": k.head_dim * d for p in ("f", "g")},
        "b_proj.weight": h * k.num_heads,
        "o_norm.weight": k.head_dim,
        "o_proj.weight": d * h,
    }


def _mla_params(s: ModelSpec) -> dict[str, int]:
    m, h = s.mla, s.hidden_size
    q_out = m.num_heads * m.qk_head_dim
    if m.q_lora_rank is None:
        q = {"q_proj.weight": h * q_out}
    else:
        r = m.q_lora_rank
        q = {"q_a_proj.weight": h * r, "q_a_layernorm.weight": r, "q_b_proj.weight": r * q_out}
    return {
        **q,
        "kv_a_proj_with_mqa.weight": h * m.latent_dim,
        "kv_a_layernorm.weight": m.kv_lora_rank,
        "kv_b_proj.weight": m.kv_lora_rank * m.num_heads * (m.qk_nope_head_dim + m.v_head_dim),
        "o_proj.weight": m.num_heads * m.v_head_dim * h,
        "indexer": dsa_params(s),
    }


def dsa_params(s: ModelSpec) -> int:
    """One MLA layer's DSA indexer: wq_b, wk, k_norm (LayerNorm: weight + bias), weights_proj."""
    m, d, h = s.mla, s.dsa, s.hidden_size
    if d is None or m is None or m.q_lora_rank is None:
        return 0
    return m.q_lora_rank * d.num_heads * d.head_dim + h * d.head_dim + 2 * d.head_dim + h * d.num_heads


def _gdn_params(s: ModelSpec) -> dict[str, int]:
    g, h = s.gdn, s.hidden_size
    return {
        "in_proj_qkvz.weight": h * (2 * g.key_dim + 2 * g.value_dim),
        "in_proj_ba.weight": h * 2 * g.num_v_heads,
        "conv1d.weight": g.conv_dim * g.conv_kernel_size,  # depthwise conv, no bias
        "dt_bias": g.num_v_heads,
        "A_log": g.num_v_heads,
        "norm.weight": g.v_head_dim,  # gated RMSNorm
        "out_proj.weight": g.value_dim * h,
    }


def _gqa_params(s: ModelSpec) -> dict[str, int]:
    a, h = s.gqa, s.hidden_size
    q_out = a.num_heads * a.head_dim * (2 if a.output_gate else 1)  # query and gate in one projection
    return {
        "q_proj.weight": h * q_out,
        "k_proj.weight": h * a.num_kv_heads * a.head_dim,
        "v_proj.weight": h * a.num_kv_heads * a.head_dim,
        "o_proj.weight": a.num_heads * a.head_dim * h,
        "q_norm.weight": a.head_dim,
        "k_norm.weight": a.head_dim,
    }


_MIXER_PARAMS = {KDA: _kda_params, MLA: _mla_params, GDN: _gdn_params, GQA: _gqa_params}


def mixer_param_numels(s: ModelSpec, kind: str) -> dict[str, int]:
    """Elements of each parameter of one token mixer of layer kind `kind`, by its path in the mixer
    (the paths `inference/parallel/split_rule.MIXER_SPLITS` names; the DSA indexer is one entry)."""
    return _MIXER_PARAMS[kind](s)


def mixer_params(s: ModelSpec, kind: str) -> int:
    """Parameters of one token mixer (attention or linear attention) of layer kind `kind`."""
    return sum(_MIXER_PARAMS[kind](s).values())


def moe_layer_params(s: ModelSpec) -> tuple[int, int, int, int]:
    """(router, shared, routed, routed active) parameters of one MoE layer."""
    e, h = s.moe, s.hidden_size
    expert = 3 * h * e.intermediate_size
    router = e.num_experts * h + (e.num_experts if e.scoring == "sigmoid" else 0)  # + correction bias
    shared = 3 * h * e.shared_width + (h if e.shared_expert_gate else 0)
    return router, shared, expert * e.num_experts, expert * e.top_k


def layer_params(s: ModelSpec, i: int) -> int:
    """One decoder layer: mixer, FFN and its two norms."""
    n = mixer_params(s, s.layer_kinds[i]) + 2 * s.hidden_size
    if s.mlp_kinds[i] == MOE:
        return n + sum(moe_layer_params(s)[:3])
    return n + 3 * s.hidden_size * s.intermediate_size


def parameter_counts(s: ModelSpec) -> tuple[dict[str, int], dict[str, int]]:
    """(headline counts, counts per component) of the text model plus the vision tower."""
    h = s.hidden_size
    comp = {"embedding": s.vocab_size * h, "lm_head": 0 if s.tie_word_embeddings else s.vocab_size * h}
    comp["norms"] = h * (2 * s.num_layers + 1)
    for kind in _MIXER_PARAMS:
        if kind in s.layer_kinds:
            comp[kind] = mixer_params(s, kind) * s.layer_kinds.count(kind)
    comp["dense_mlp"] = 3 * h * s.intermediate_size * s.mlp_kinds.count(DENSE)
    n_moe = s.mlp_kinds.count(MOE)
    routed_active = 0
    if s.moe is not None and n_moe:
        router, shared, routed, active = moe_layer_params(s)
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
        head["mtp"] = s.mtp.num_layers * (3 * h + 2 * h * h + layer_params(s, s.num_layers - 1))
    return head, comp


def kv_per_layer(s: ModelSpec, kind: str, dtype_bytes: int) -> int:
    """Paged-cache bytes one token takes in one layer of `kind` (the cache spec's arithmetic)."""
    if kind not in (MLA, GQA):
        return 0
    return HybridCacheSpec.from_model_spec(s, dtype_bytes).kv_bytes_per_layer_token


def state_per_layer(s: ModelSpec, kind: str, dtype_bytes: int) -> int:
    """State-slot bytes one sequence takes in one layer of `kind` (the cache spec's arithmetic)."""
    if kind not in (KDA, GDN):
        return 0
    return HybridCacheSpec.from_model_spec(s, dtype_bytes).state_bytes_per_layer_slot


def cache_bytes(s: ModelSpec, kv_dtype_bytes: int = KV_DTYPE_BYTES) -> tuple[int, int]:
    """(KV bytes per token, recurrent-state bytes per sequence), over all layers."""
    kv = sum(kv_per_layer(s, kind, kv_dtype_bytes) for kind in s.layer_kinds)
    state = sum(state_per_layer(s, kind, kv_dtype_bytes) for kind in s.layer_kinds)
    return kv, state

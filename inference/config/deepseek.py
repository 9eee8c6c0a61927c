"""DeepSeek-V3 layout: `deepseek_v3` (DeepSeek-V3/R1), `deepseek_v32` (V3.2: + DSA indexer) and
`kimi_k2` (Kimi-K2/K2.5 text, DeepSeek-V3 architecture with 384 experts and one dense layer).

Every layer is MLA with rope on the shared key (interleaved, as transformers' `rope_interleave`);
FFNs are dense for the first `first_k_dense_replace` layers, then sigmoid grouped-top-k MoE with
`e_score_correction_bias` (`topk_method: noaux_tc`). MTP layers (`num_nextn_predict_layers`)
are noted in the spec, not built.
"""

from __future__ import annotations

from typing import Any

from inference.config.common import (
    DEEPSEEK_MOE,
    dsa_spec,
    mla_spec,
    mlp_kinds,
    moe_spec,
    mtp_spec,
    quantization,
)
from inference.config.fields import check_keys, fixed, get, keys, positive
from inference.config.spec import DENSE, MLA, MOE, ConfigError, ModelSpec

__all__ = ["MODEL_TYPES", "read"]

MODEL_TYPES = ("deepseek_v3", "deepseek_v32", "kimi_k2")

_KEYS = keys(
    "model_type vocab_size hidden_size intermediate_size moe_intermediate_size num_hidden_layers "
    "num_attention_heads num_key_value_heads n_shared_experts n_routed_experts routed_scaling_factor "
    "kv_lora_rank q_lora_rank qk_rope_head_dim v_head_dim qk_nope_head_dim topk_method n_group topk_group "
    "num_experts_per_tok moe_layer_freq first_k_dense_replace norm_topk_prob scoring_func hidden_act "
    "rms_norm_eps tie_word_embeddings rope_theta rope_scaling rope_parameters rope_interleave attention_bias "
    "mlp_bias num_nextn_predict_layers quantization_config index_topk index_n_heads index_head_dim "
    "mlp_layer_types layer_types"
)
_IGNORED = {
    "head_dim": "transformers' alias of qk_rope_head_dim; MLA geometry is read from the q/k/v dims",
}
_ATTN_TYPES = {"full_attention", "deepseek_sparse_attention"}


def _mlp_kinds(cfg: dict[str, Any], num_layers: int, moe: Any) -> tuple[str, ...]:
    kinds = mlp_kinds(cfg, num_layers, moe)
    listed = get(cfg, "mlp_layer_types", list, default=None)  # transformers-5 exports spell it out
    if listed is not None:
        names = {"dense": DENSE, "sparse": MOE}
        if len(listed) != num_layers or any(x not in names for x in listed):
            raise ConfigError("mlp_layer_types", f"expected {num_layers} of 'dense'/'sparse', got {listed!r}")
        if tuple(names[x] for x in listed) != kinds:
            raise ConfigError("mlp_layer_types", "disagrees with first_k_dense_replace / moe_layer_freq")
    return kinds


def read(cfg: dict[str, Any], prefix: str = "") -> ModelSpec:
    check_keys(cfg, _KEYS, prefix, _IGNORED)
    model_type = get(cfg, "model_type", str)
    act = get(cfg, "hidden_act", str, default="silu")
    if act != "silu":
        raise ConfigError(prefix + "hidden_act", f"only 'silu' is supported, got {act!r}")
    if get(cfg, "mlp_bias", bool, default=False):
        raise ConfigError(prefix + "mlp_bias", "MLP projections with bias are not supported")
    fixed(cfg, "rope_interleave", (True,), prefix)  # the published layout; half-split is not implemented
    fixed(cfg, "moe_layer_freq", (1,), prefix)  # every published config; transformers ignores other values
    num_layers = positive(get(cfg, "num_hidden_layers", int), "num_hidden_layers")
    mla = mla_spec(cfg, use_rope=True)
    if mla.qk_rope_head_dim <= 0:
        raise ConfigError(prefix + "qk_rope_head_dim", "DeepSeek MLA rotates a shared rope key; must be > 0")
    moe = moe_spec(cfg, DEEPSEEK_MOE)
    dsa = dsa_spec(cfg, mla)
    if model_type == "deepseek_v32" and dsa is None:
        raise ConfigError(prefix + "index_topk", "deepseek_v32 needs the DSA indexer fields")
    attn = get(cfg, "layer_types", list, default=None)
    if attn is not None and (len(attn) != num_layers or not set(attn) <= _ATTN_TYPES):
        raise ConfigError(prefix + "layer_types", f"expected {num_layers} of {sorted(_ATTN_TYPES)}")
    return ModelSpec(
        model_type=model_type,
        vocab_size=positive(get(cfg, "vocab_size", int), "vocab_size"),
        hidden_size=positive(get(cfg, "hidden_size", int), "hidden_size"),
        intermediate_size=positive(get(cfg, "intermediate_size", int), "intermediate_size"),
        num_layers=num_layers,
        layer_kinds=(MLA,) * num_layers,
        mlp_kinds=_mlp_kinds(cfg, num_layers, moe),
        rms_norm_eps=get(cfg, "rms_norm_eps", float, default=1e-6),
        tie_word_embeddings=get(cfg, "tie_word_embeddings", bool, default=False),
        kda=None,
        mla=mla,
        moe=moe,
        dsa=dsa,
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        mtp=mtp_spec(cfg),
        quantization=quantization(cfg, prefix),
    )

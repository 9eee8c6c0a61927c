"""`kimi_linear` (moonshotai/Kimi-Linear-48B-A3B-*): KDA and MLA layers listed 1-based in
`linear_attn_config`, NoPE MLA, sigmoid grouped-top-k MoE; the DSA indexer fields as
`deepseek_v32` names them put a lightning indexer on every full-attention layer."""

from __future__ import annotations

from typing import Any

from inference.config.common import KIMI_MOE, dsa_spec, mla_spec, mlp_kinds, moe_spec, mtp_spec, quantization
from inference.config.fields import check_keys, get, keys, positive
from inference.config.spec import KDA, MLA, ConfigError, KDASpec, ModelSpec

__all__ = ["MODEL_TYPES", "read"]

MODEL_TYPES = ("kimi_linear",)

_KEYS = keys(
    "model_type vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads hidden_act rms_norm_eps tie_word_embeddings rope_theta rope_scaling rope_parameters "
    "attention_bias linear_attn_config q_lora_rank kv_lora_rank qk_nope_head_dim "
    "qk_rope_head_dim v_head_dim mla_use_nope num_experts num_experts_per_token "
    "moe_intermediate_size num_shared_experts routed_scaling_factor moe_renormalize "
    "moe_router_activation_func num_expert_group topk_group "
    "first_k_dense_replace moe_layer_freq index_topk index_n_heads index_head_dim "
    "num_nextn_predict_layers quantization_config"
)
_IGNORED = {
    "head_dim": "derived: the MLA/KDA head dims are read from their own fields",
    "use_grouped_topk": "grouping is on whenever num_expert_group > 1",
}
_LINEAR_KEYS = keys("kda_layers full_attn_layers num_heads head_dim short_conv_kernel_size")


def _layer_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    lin = get(cfg, "linear_attn_config", dict)
    check_keys(lin, _LINEAR_KEYS, "linear_attn_config.", {})
    kda = get(lin, "kda_layers", list, "linear_attn_config.", default=None)
    full = get(lin, "full_attn_layers", list, "linear_attn_config.")
    if kda is None:  # some exports list only the full layers; the rest are KDA
        kda = [i for i in range(1, num_layers + 1) if i not in set(full)]
    kinds: list[str | None] = [None] * num_layers
    for name, layers, kind in (("kda_layers", kda, KDA), ("full_attn_layers", full, MLA)):
        for layer in layers:
            field = f"linear_attn_config.{name}"
            if not isinstance(layer, int) or isinstance(layer, bool) or not 1 <= layer <= num_layers:
                raise ConfigError(field, f"layer {layer!r} is not a 1-based index in 1..{num_layers}")
            if kinds[layer - 1] == kind:
                raise ConfigError(field, f"layer {layer} is listed twice")
            if kinds[layer - 1] is not None:
                raise ConfigError(field, f"layer {layer} is in both kda_layers and full_attn_layers")
            kinds[layer - 1] = kind
    missing = [i + 1 for i, k in enumerate(kinds) if k is None]
    if missing:
        raise ConfigError("linear_attn_config", f"layers {missing} are neither KDA nor full attention")
    return tuple(k for k in kinds if k is not None)


def _kda_spec(cfg: dict[str, Any]) -> KDASpec:
    lin = cfg["linear_attn_config"]
    p = "linear_attn_config."
    return KDASpec(
        num_heads=positive(get(lin, "num_heads", int, p), p + "num_heads"),
        head_dim=positive(get(lin, "head_dim", int, p), p + "head_dim"),
        conv_kernel_size=positive(
            get(lin, "short_conv_kernel_size", int, p, default=4), p + "short_conv_kernel_size"
        ),
    )


def read(cfg: dict[str, Any], prefix: str = "") -> ModelSpec:
    check_keys(cfg, _KEYS, prefix, _IGNORED)
    act = get(cfg, "hidden_act", str, default="silu")
    if act != "silu":
        raise ConfigError(prefix + "hidden_act", f"only 'silu' is supported, got {act!r}")
    num_layers = positive(get(cfg, "num_hidden_layers", int), "num_hidden_layers")
    mla = mla_spec(cfg, use_rope=not get(cfg, "mla_use_nope", bool, default=False))
    moe = moe_spec(cfg, KIMI_MOE)
    return ModelSpec(
        model_type="kimi_linear",
        vocab_size=positive(get(cfg, "vocab_size", int), "vocab_size"),
        hidden_size=positive(get(cfg, "hidden_size", int), "hidden_size"),
        intermediate_size=positive(get(cfg, "intermediate_size", int), "intermediate_size"),
        num_layers=num_layers,
        layer_kinds=_layer_kinds(cfg, num_layers),
        mlp_kinds=mlp_kinds(cfg, num_layers, moe),
        rms_norm_eps=get(cfg, "rms_norm_eps", float, default=1e-5),
        tie_word_embeddings=get(cfg, "tie_word_embeddings", bool, default=False),
        kda=_kda_spec(cfg),
        mla=mla,
        moe=moe,
        dsa=dsa_spec(cfg, mla),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        mtp=mtp_spec(cfg),
        quantization=quantization(cfg, prefix),
    )

"""`qwen3_next` (Qwen/Qwen3-Next-80B-A3B-*): gated DeltaNet linear attention on three of every
four layers, gated GQA softmax attention (q/k RMSNorm, partial rope, sigmoid output gate) on the
fourth, and a softmax-routed MoE with one gated shared expert.

Served by `inference/model/qwen3_next.py` (square GDN states only: linear_key_head_dim ==
linear_value_head_dim, as published).
"""

from __future__ import annotations

from typing import Any

from inference.config.common import quantization
from inference.config.fields import check_keys, fixed, get, keys, positive
from inference.config.spec import DENSE, GDN, GQA, MOE, ConfigError, GDNSpec, GQASpec, ModelSpec, MoESpec

__all__ = ["MODEL_TYPES", "read"]

MODEL_TYPES = ("qwen3_next",)

_KEYS = keys(
    "model_type vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads hidden_act rms_norm_eps tie_word_embeddings rope_theta rope_scaling rope_parameters "
    "partial_rotary_factor attention_bias head_dim linear_conv_kernel_dim linear_key_head_dim "
    "linear_value_head_dim linear_num_key_heads linear_num_value_heads decoder_sparse_step "
    "moe_intermediate_size shared_expert_intermediate_size num_experts_per_tok num_experts norm_topk_prob "
    "mlp_only_layers layer_types full_attention_interval use_sliding_window quantization_config"
)
_IGNORED = {
    "sliding_window": "read only with use_sliding_window, which must be false",
    "max_window_layers": "read only with use_sliding_window, which must be false",
}
_LAYER_NAMES = {"linear_attention": GDN, "full_attention": GQA}


def _layer_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    listed = get(cfg, "layer_types", list, default=None)
    if listed is None:
        interval = positive(get(cfg, "full_attention_interval", int, default=4), "full_attention_interval")
        return tuple(GQA if (i + 1) % interval == 0 else GDN for i in range(num_layers))
    if len(listed) != num_layers or any(x not in _LAYER_NAMES for x in listed):
        raise ConfigError("layer_types", f"expected {num_layers} of {sorted(_LAYER_NAMES)}, got {listed!r}")
    return tuple(_LAYER_NAMES[x] for x in listed)


def _mlp_kinds(cfg: dict[str, Any], num_layers: int, has_moe: bool) -> tuple[str, ...]:
    dense_only = get(cfg, "mlp_only_layers", list, default=[])
    if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < num_layers for i in dense_only):
        raise ConfigError("mlp_only_layers", f"expected 0-based layer indices in 0..{num_layers - 1}")
    step = positive(get(cfg, "decoder_sparse_step", int, default=1), "decoder_sparse_step")
    return tuple(
        MOE if has_moe and i not in dense_only and (i + 1) % step == 0 else DENSE for i in range(num_layers)
    )


def _rotary(cfg: dict[str, Any], head_dim: int) -> tuple[float, int]:
    params = get(cfg, "rope_parameters", dict, default=None) or {}
    if params.get("rope_type", "default") != "default" or get(cfg, "rope_scaling", dict, default=None):
        raise ConfigError("rope_scaling", "rope scaling is not supported for qwen3_next")
    theta = float(params.get("rope_theta", get(cfg, "rope_theta", float, default=10000.0)))
    factor = params.get("partial_rotary_factor", get(cfg, "partial_rotary_factor", float, default=0.25))
    rotary = int(head_dim * float(factor))
    if rotary <= 0 or rotary % 2 or rotary > head_dim:
        raise ConfigError("partial_rotary_factor", f"gives {rotary} rotary dims of head_dim {head_dim}")
    return theta, rotary


def read(cfg: dict[str, Any], prefix: str = "") -> ModelSpec:
    check_keys(cfg, _KEYS, prefix, _IGNORED)
    if get(cfg, "hidden_act", str, default="silu") != "silu":
        raise ConfigError(prefix + "hidden_act", f"only 'silu' is supported, got {cfg['hidden_act']!r}")
    fixed(cfg, "use_sliding_window", (False,), prefix)
    if get(cfg, "attention_bias", bool, default=False):
        raise ConfigError(prefix + "attention_bias", "attention projections with bias are not supported")
    num_layers = positive(get(cfg, "num_hidden_layers", int), "num_hidden_layers")
    heads = positive(get(cfg, "num_attention_heads", int), "num_attention_heads")
    kv_heads = positive(get(cfg, "num_key_value_heads", int, default=heads), "num_key_value_heads")
    if heads % kv_heads:
        raise ConfigError("num_key_value_heads", f"{kv_heads} does not divide num_attention_heads={heads}")
    head_dim = positive(get(cfg, "head_dim", int), "head_dim")
    theta, rotary = _rotary(cfg, head_dim)
    gdn = GDNSpec(
        num_k_heads=positive(get(cfg, "linear_num_key_heads", int), "linear_num_key_heads"),
        num_v_heads=positive(get(cfg, "linear_num_value_heads", int), "linear_num_value_heads"),
        k_head_dim=positive(get(cfg, "linear_key_head_dim", int), "linear_key_head_dim"),
        v_head_dim=positive(get(cfg, "linear_value_head_dim", int), "linear_value_head_dim"),
        conv_kernel_size=positive(
            get(cfg, "linear_conv_kernel_dim", int, default=4), "linear_conv_kernel_dim"
        ),
    )
    if gdn.num_v_heads % gdn.num_k_heads:
        raise ConfigError(
            "linear_num_value_heads", f"must be a multiple of linear_num_key_heads={gdn.num_k_heads}"
        )
    num_experts = get(cfg, "num_experts", int, default=0)
    moe = None
    if num_experts:
        moe = MoESpec(
            num_experts=positive(num_experts, "num_experts"),
            top_k=positive(get(cfg, "num_experts_per_tok", int), "num_experts_per_tok"),
            intermediate_size=positive(get(cfg, "moe_intermediate_size", int), "moe_intermediate_size"),
            num_shared_experts=1,
            routed_scaling_factor=1.0,
            renormalize=get(cfg, "norm_topk_prob", bool, default=True),
            num_groups=1,
            topk_groups=1,
            scoring="softmax",
            shared_intermediate_size=positive(
                get(cfg, "shared_expert_intermediate_size", int), "shared_expert_intermediate_size"
            ),
            shared_expert_gate=True,
        )
        if moe.top_k > moe.num_experts:
            raise ConfigError("num_experts_per_tok", f"{moe.top_k} exceeds num_experts={moe.num_experts}")
    kinds = _layer_kinds(cfg, num_layers)
    return ModelSpec(
        model_type="qwen3_next",
        vocab_size=positive(get(cfg, "vocab_size", int), "vocab_size"),
        hidden_size=positive(get(cfg, "hidden_size", int), "hidden_size"),
        intermediate_size=positive(get(cfg, "intermediate_size", int), "intermediate_size"),
        num_layers=num_layers,
        layer_kinds=kinds,
        mlp_kinds=_mlp_kinds(cfg, num_layers, moe is not None),
        rms_norm_eps=get(cfg, "rms_norm_eps", float, default=1e-6),
        tie_word_embeddings=get(cfg, "tie_word_embeddings", bool, default=False),
        kda=None,
        mla=None,
        moe=moe,
        gdn=gdn if GDN in kinds else None,
        gqa=GQASpec(heads, kv_heads, head_dim, rotary, theta, output_gate=True) if GQA in kinds else None,
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
        quantization=quantization(cfg, prefix),
    )

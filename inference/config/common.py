"""Pieces two or more families share: MLA (+DSA), sigmoid-routed MoE, layer FFN kinds, rope
scaling and the checkpoint's quantization. Each family reader passes its own field names."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from inference.config.fields import fixed, get, keys, positive
from inference.config.spec import DENSE, MOE, ConfigError, DSASpec, MLASpec, MoESpec, MTPSpec, QuantSpec

__all__ = [
    "DEEPSEEK_MOE",
    "KIMI_MOE",
    "MoENames",
    "dsa_spec",
    "mla_spec",
    "mlp_kinds",
    "moe_spec",
    "mtp_spec",
    "quantization",
    "rope",
]

DSA_KEYS = ("index_topk", "index_n_heads", "index_head_dim")
# What transformers' `_compute_yarn_parameters` reads (and the type selector); anything else would
# be a YaRN variant we might misread.
_YARN_KEYS = keys(
    "type rope_type factor original_max_position_embeddings beta_fast beta_slow mscale mscale_all_dim "
    "attention_factor truncate rope_theta"
)


@dataclass(frozen=True, slots=True)
class MoENames:
    """How one family spells the MoE fields (the same meaning, different published names)."""

    num_experts: str
    top_k: str
    num_shared: str
    renormalize: str
    scoring: str
    num_groups: str


KIMI_MOE = MoENames(
    "num_experts", "num_experts_per_token", "num_shared_experts", "moe_renormalize",
    "moe_router_activation_func", "num_expert_group",
)  # fmt: skip
DEEPSEEK_MOE = MoENames(
    "n_routed_experts", "num_experts_per_tok", "n_shared_experts", "norm_topk_prob", "scoring_func", "n_group"
)


def rope(cfg: dict[str, Any], default_theta: float) -> tuple[float, tuple[tuple[str, object], ...] | None]:
    """(theta, scaling items or None) from `rope_theta` + `rope_scaling` or transformers-5
    `rope_parameters`. Only YaRN scaling is known (DeepSeek-V3, Kimi-K2); others are refused.
    The MLA layer computes it (`inference.model.rope`)."""
    params = get(cfg, "rope_parameters", dict, default=None)
    if params is not None:
        theta = float(params.get("rope_theta", default_theta))
        scaling = None if params.get("rope_type", "default") == "default" else params
        field = "rope_parameters"
    else:
        theta = get(cfg, "rope_theta", float, default=default_theta)
        scaling = get(cfg, "rope_scaling", dict, default=None)
        field = "rope_scaling"
    if scaling is None:
        return theta, None
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind != "yarn":
        raise ConfigError(field, f"only YaRN rope scaling is known, got {kind!r}")
    for key in ("factor", "original_max_position_embeddings"):
        if not isinstance(scaling.get(key), int | float) or isinstance(scaling.get(key), bool):
            raise ConfigError(f"{field}.{key}", "YaRN needs a number here")
    for key in scaling:
        if key not in _YARN_KEYS:
            raise ConfigError(
                f"{field}.{key}", f"unknown YaRN parameter (known: {', '.join(sorted(_YARN_KEYS))})"
            )
    if float(scaling["factor"]) < 1:
        raise ConfigError(
            f"{field}.factor", f"YaRN stretches the context: must be >= 1, got {scaling['factor']}"
        )
    items = tuple(sorted((k, v) for k, v in scaling.items() if k not in ("rope_theta",)))
    return theta, items


def mla_spec(cfg: dict[str, Any], *, use_rope: bool, default_theta: float = 10000.0) -> MLASpec:
    heads = positive(get(cfg, "num_attention_heads", int), "num_attention_heads")
    kv_heads = get(cfg, "num_key_value_heads", int, default=heads)
    if kv_heads != heads:
        raise ConfigError("num_key_value_heads", f"MLA expands its latent to every head; expected {heads}")
    if get(cfg, "attention_bias", bool, default=False):
        raise ConfigError("attention_bias", "MLA projections with bias are not supported")
    q_lora = get(cfg, "q_lora_rank", int, default=None)
    if q_lora is not None:
        positive(q_lora, "q_lora_rank")
    theta, scaling = rope(cfg, default_theta)
    return MLASpec(
        num_heads=heads,
        q_lora_rank=q_lora,
        kv_lora_rank=positive(get(cfg, "kv_lora_rank", int), "kv_lora_rank"),
        qk_nope_head_dim=positive(get(cfg, "qk_nope_head_dim", int), "qk_nope_head_dim"),
        qk_rope_head_dim=get(cfg, "qk_rope_head_dim", int),
        v_head_dim=positive(get(cfg, "v_head_dim", int), "v_head_dim"),
        use_rope=use_rope,
        rope_theta=theta,
        rope_scaling=scaling,
    )


def moe_spec(cfg: dict[str, Any], names: MoENames) -> MoESpec | None:
    """Sigmoid-scored, bias-corrected grouped top-k with shared experts (DeepSeek-V3 routing)."""
    n = names
    num_experts = get(cfg, n.num_experts, int, default=0)
    if num_experts == 0:
        return None
    act = get(cfg, n.scoring, str, default="sigmoid")
    if act != "sigmoid":
        raise ConfigError(n.scoring, f"only 'sigmoid' routing is supported, got {act!r}")
    fixed(cfg, "topk_method", ("noaux_tc",))  # the bias-corrected choice TopKRouter implements
    spec = MoESpec(
        num_experts=positive(num_experts, n.num_experts),
        top_k=positive(get(cfg, n.top_k, int), n.top_k),
        intermediate_size=positive(get(cfg, "moe_intermediate_size", int), "moe_intermediate_size"),
        num_shared_experts=get(cfg, n.num_shared, int, default=0),
        routed_scaling_factor=get(cfg, "routed_scaling_factor", float, default=1.0),
        renormalize=get(cfg, n.renormalize, bool, default=True),
        num_groups=positive(get(cfg, n.num_groups, int, default=1), n.num_groups),
        topk_groups=positive(get(cfg, "topk_group", int, default=1), "topk_group"),
    )
    if spec.top_k > spec.num_experts:
        raise ConfigError(n.top_k, f"{spec.top_k} exceeds {n.num_experts}={spec.num_experts}")
    if spec.num_experts % spec.num_groups:
        raise ConfigError(
            n.num_groups, f"{spec.num_groups} does not divide {n.num_experts}={spec.num_experts}"
        )
    if spec.topk_groups > spec.num_groups:
        raise ConfigError("topk_group", f"{spec.topk_groups} exceeds {n.num_groups}={spec.num_groups}")
    if spec.num_groups > 1 and spec.num_experts // spec.num_groups < 2:
        raise ConfigError(n.num_groups, "group scores take the top-2 experts; groups need >= 2 experts")
    if spec.topk_groups * (spec.num_experts // spec.num_groups) < spec.top_k:
        raise ConfigError("topk_group", f"the selected groups hold fewer experts than {n.top_k}")
    return spec


def dsa_spec(cfg: dict[str, Any], mla: MLASpec) -> DSASpec | None:
    present = [k for k in DSA_KEYS if cfg.get(k) is not None]
    if not present:
        return None
    for key in DSA_KEYS:
        if key not in present:
            raise ConfigError(
                key, f"DSA needs all of index_topk/index_n_heads/index_head_dim (got {present})"
            )
    spec = DSASpec(
        topk=positive(get(cfg, "index_topk", int), "index_topk"),
        num_heads=positive(get(cfg, "index_n_heads", int), "index_n_heads"),
        head_dim=positive(get(cfg, "index_head_dim", int), "index_head_dim"),
    )
    if mla.q_lora_rank is None:
        raise ConfigError("q_lora_rank", "the DSA indexer reads the query latent; set q_lora_rank")
    if mla.use_rope and spec.head_dim < mla.qk_rope_head_dim:
        raise ConfigError("index_head_dim", f"must be >= qk_rope_head_dim={mla.qk_rope_head_dim}")
    return spec


def mlp_kinds(cfg: dict[str, Any], num_layers: int, moe: MoESpec | None) -> tuple[str, ...]:
    """DeepSeek/Kimi layout: the first `first_k_dense_replace` layers dense, then MoE every `moe_layer_freq`."""
    if moe is None:
        return (DENSE,) * num_layers
    first_dense = get(cfg, "first_k_dense_replace", int, default=0)
    freq = positive(get(cfg, "moe_layer_freq", int, default=1), "moe_layer_freq")
    if not 0 <= first_dense <= num_layers:
        raise ConfigError("first_k_dense_replace", f"must be in 0..{num_layers}, got {first_dense}")
    return tuple(
        MOE if i >= first_dense and (i - first_dense) % freq == 0 else DENSE for i in range(num_layers)
    )


def mtp_spec(cfg: dict[str, Any]) -> MTPSpec | None:
    n = get(cfg, "num_nextn_predict_layers", int, default=0)
    if n < 0:
        raise ConfigError("num_nextn_predict_layers", f"must be >= 0, got {n}")
    return MTPSpec(n) if n else None


def _fp8(q: dict[str, Any], field: str) -> QuantSpec:
    """DeepSeek-V3 block FP8 (`quant_method: fp8`, also Qwen3-Next-FP8's layout)."""
    fixed(q, "fmt", ("e4m3",), field + ".")
    fixed(q, "scale_fmt", ("ue8m0",), field + ".")  # V3.1: power-of-two scales, stored as plain floats
    # static activation scales would have the served model quantize activations too; dequantized
    # weights alone compute a different function
    fixed(q, "activation_scheme", ("dynamic",), field + ".")
    block = q.get("weight_block_size")
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise ConfigError(
            field + ".weight_block_size", f"expected [rows, cols] of the FP8 scale tiles, got {block!r}"
        )
    ignore = q.get("modules_to_not_convert") or []
    return QuantSpec("fp8", 8, block=(block[0], block[1]), ignore=tuple(map(str, ignore)))


def _int4(q: dict[str, Any], field: str) -> QuantSpec:
    """compressed-tensors W4A16 `pack-quantized` (Kimi-K2-Thinking, K2.5: routed experts only)."""
    groups = q.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise ConfigError(field + ".config_groups", "expected exactly one quantization group")
    ((name, group),) = groups.items()
    g = f"{field}.config_groups.{name}"
    w = group.get("weights") if isinstance(group, dict) else None
    if not isinstance(w, dict):
        raise ConfigError(g + ".weights", "missing")
    fmt = group.get("format") or q.get("format")
    if fmt != "pack-quantized":
        raise ConfigError(field + ".format", f"only 'pack-quantized' is read, got {fmt!r}")
    want = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "dynamic": False}
    for key, value in want.items():
        if w.get(key, value) != value:
            raise ConfigError(f"{g}.weights.{key}", f"only {value!r} is supported, got {w.get(key)!r}")
    if w.get("actorder"):
        raise ConfigError(f"{g}.weights.actorder", "activation-ordered groups (g_idx) are not supported")
    size = w.get("group_size")
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        raise ConfigError(f"{g}.weights.group_size", f"expected a positive int, got {size!r}")
    if group.get("input_activations") or group.get("output_activations"):
        raise ConfigError(g + ".input_activations", "quantized activations are not supported (W4A16 only)")
    if "Linear" not in (group.get("targets") or []):
        raise ConfigError(
            g + ".targets", f"expected 'Linear' among the targets, got {group.get('targets')!r}"
        )
    fixed(q, "quantization_status", ("compressed",), field + ".")  # anything else is not packed on disk
    if q.get("kv_cache_scheme") or q.get("sparsity_config"):
        raise ConfigError(field, "kv_cache_scheme / sparsity_config are not supported")
    return QuantSpec("int4", 4, group_size=size, ignore=tuple(map(str, q.get("ignore") or [])))


def quantization(cfg: dict[str, Any], prefix: str = "") -> QuantSpec | None:
    """The checkpoint's stored weight format: DeepSeek block FP8, compressed-tensors INT4 (the
    Kimi-K2-Thinking / K2.5 release), or None (plain `torch_dtype`). The loader dequantizes both
    to the serving dtype (`inference.quantized_weights`)."""
    field = prefix + "quantization_config"
    q = get(cfg, "quantization_config", dict, prefix, default=None)
    if q is None:
        return None
    method = q.get("quant_method")
    if method == "fp8":
        return _fp8(q, field)
    if method == "compressed-tensors":
        return _int4(q, field)
    raise ConfigError(
        field + ".quant_method", f"unknown weight format {method!r} (known: fp8, compressed-tensors)"
    )

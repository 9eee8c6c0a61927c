"""Parse a Hugging Face `config.json` of the Kimi-Linear / Kimi-K3 family into one frozen spec.

Accepted inputs:

* a `kimi_linear` config as published (`moonshotai/Kimi-Linear-48B-A3B-*`): KDA and MLA layers
  listed 1-based in `linear_attn_config`, MLA ranks, MoE fields (grouped top-k, shared experts,
  routed scaling, first dense layers);
* the same text fields plus the DSA indexer fields as `deepseek_v32` names them
  (`index_topk`, `index_n_heads`, `index_head_dim`), which put a lightning indexer on every
  full-attention layer;
* a multimodal wrapper (`kimi_k25`-style) holding a `text_config` (the above) and a
  MoonViT `vision_config` (patch 14, merge 2x2) with its projector.

Unknown keys and inconsistent values raise `ConfigError` naming the field: a config we would
silently misread is worse than one we refuse.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

__all__ = [
    "ConfigError",
    "DSASpec",
    "KDASpec",
    "MLASpec",
    "MoESpec",
    "ModelSpec",
    "VisionSpec",
    "load_config",
    "parse_config",
]

KDA = "kda"
MLA = "mla"
DENSE = "dense"
MOE = "moe"


class ConfigError(ValueError):
    """A config field is unknown, missing, or inconsistent with the others."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"config field '{field}': {message}")
        self.field = field


@dataclass(frozen=True, slots=True)
class KDASpec:
    """Kimi Delta Attention geometry (value head dim equals key head dim, as published)."""

    num_heads: int
    head_dim: int
    conv_kernel_size: int

    @property
    def proj_dim(self) -> int:
        return self.num_heads * self.head_dim


@dataclass(frozen=True, slots=True)
class MLASpec:
    """Multi-head latent attention geometry. `use_rope=False` is Kimi-Linear's NoPE variant."""

    num_heads: int
    q_lora_rank: int | None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    use_rope: bool
    rope_theta: float

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def latent_dim(self) -> int:
        """Width of one cached token: normalised latent plus the shared rope key."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True, slots=True)
class DSASpec:
    """DeepSeek-V3.2 sparse attention: a lightning indexer picks `topk` keys per query."""

    topk: int
    num_heads: int
    head_dim: int


@dataclass(frozen=True, slots=True)
class MoESpec:
    """Routed experts with sigmoid scores, grouped top-k and shared experts."""

    num_experts: int
    top_k: int
    intermediate_size: int
    num_shared_experts: int
    routed_scaling_factor: float
    renormalize: bool
    num_groups: int
    topk_groups: int


@dataclass(frozen=True, slots=True)
class VisionSpec:
    """MoonViT tower and its 2-layer projector into the text hidden size."""

    patch_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_layers: int
    pos_emb_height: int
    pos_emb_width: int
    pos_emb_time: int
    merge_kernel: tuple[int, int]
    rope_theta: float
    projector_ln_eps: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def merged_dim(self) -> int:
        return self.hidden_size * self.merge_kernel[0] * self.merge_kernel[1]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """Everything the model, cache and analysis need, with 0-based per-layer kinds."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    layer_kinds: tuple[str, ...]  # KDA | MLA per layer
    mlp_kinds: tuple[str, ...]  # DENSE | MOE per layer
    rms_norm_eps: float
    tie_word_embeddings: bool
    kda: KDASpec
    mla: MLASpec
    moe: MoESpec | None
    dsa: DSASpec | None = None
    vision: VisionSpec | None = None
    image_token_id: int | None = None
    torch_dtype: str = "bfloat16"

    @property
    def kda_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == KDA)

    @property
    def mla_layers(self) -> tuple[int, ...]:
        return tuple(i for i, k in enumerate(self.layer_kinds) if k == MLA)


def _keys(names: str) -> frozenset[str]:
    return frozenset(names.split())


# Keys that describe provenance or generation defaults and do not change the computed function.
_METADATA_KEYS = _keys(
    "architectures auto_map bos_token_id eos_token_id pad_token_id dtype torch_dtype "
    "transformers_version initializer_range model_max_length max_position_embeddings use_cache "
    "_name_or_path _commit_hash attention_dropout head_dim num_nextn_predict_layers"
)
_TEXT_KEYS = _keys(
    "model_type vocab_size hidden_size intermediate_size num_hidden_layers num_attention_heads "
    "num_key_value_heads hidden_act rms_norm_eps tie_word_embeddings rope_theta rope_scaling "
    "attention_bias linear_attn_config q_lora_rank kv_lora_rank qk_nope_head_dim "
    "qk_rope_head_dim v_head_dim mla_use_nope num_experts num_experts_per_token "
    "moe_intermediate_size num_shared_experts routed_scaling_factor moe_renormalize "
    "moe_router_activation_func use_grouped_topk num_expert_group topk_group "
    "first_k_dense_replace moe_layer_freq index_topk index_n_heads index_head_dim"
)
_LINEAR_KEYS = _keys("kda_layers full_attn_layers num_heads head_dim short_conv_kernel_size")
_VISION_KEYS = _keys(
    "model_type patch_size hidden_size intermediate_size num_attention_heads num_hidden_layers "
    "pos_emb_height pos_emb_width pos_emb_time merge_kernel_size hidden_act rope_parameters "
    "rope_theta projector_ln_eps mm_hidden_size text_hidden_size _attn_implementation"
)
# Published MoonViT spellings (Kimi-K2.5 `vision_config`) -> the transformers names above.
_VISION_ALIASES = {
    "vt_hidden_size": "hidden_size",
    "vt_intermediate_size": "intermediate_size",
    "vt_num_attention_heads": "num_attention_heads",
    "vt_num_hidden_layers": "num_hidden_layers",
    "init_pos_emb_height": "pos_emb_height",
    "init_pos_emb_width": "pos_emb_width",
    "init_pos_emb_time": "pos_emb_time",
    "activation_func": "hidden_act",
}
# Published fields that select a variant: only the MoonViT of Kimi-K2.5 is implemented.
_VISION_FIXED = {
    "merge_type": "sd2_tpool",
    "mm_projector_type": "patchmerger",
    "pos_emb_type": "divided_fixed",
    "projector_hidden_act": "gelu",
    "video_attn_type": "spatial_temporal",
}
_WRAPPER_KEYS = _keys(
    "model_type text_config vision_config projection_hidden_size projection_layer_norm_eps "
    "image_token_id video_token_id vision_start_token_id vision_end_token_id "
    "tie_word_embeddings media_placeholder_token_id image_placeholder video_placeholder "
    "use_unified_vision_chunk ignore_index"
)
_TEXT_MODEL_TYPES = frozenset({"kimi_linear"})
_WRAPPER_MODEL_TYPES = frozenset({"kimi_k25", "kimi_vl", "kimi_k3"})


def _check_keys(cfg: dict[str, Any], allowed: frozenset[str], prefix: str) -> None:
    for key in cfg:
        if key not in allowed and key not in _METADATA_KEYS:
            raise ConfigError(f"{prefix}{key}", "unknown field (not understood by this runtime)")


def _get(
    cfg: dict[str, Any], key: str, kind: type | tuple[type, ...], prefix: str = "", **default: Any
) -> Any:
    if key not in cfg or cfg[key] is None:
        if "default" in default:
            return default["default"]
        raise ConfigError(prefix + key, "required but missing")
    value = cfg[key]
    # bool is an int subclass: refuse True where a count is meant.
    if isinstance(value, bool) and kind is int:
        raise ConfigError(prefix + key, f"expected int, got {value!r}")
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind):
        raise ConfigError(prefix + key, f"expected {kind}, got {type(value).__name__} {value!r}")
    return value


def _positive(value: int, field: str) -> int:
    if value <= 0:
        raise ConfigError(field, f"must be positive, got {value}")
    return value


def _layer_kinds(cfg: dict[str, Any], num_layers: int) -> tuple[str, ...]:
    lin = _get(cfg, "linear_attn_config", dict)
    _check_keys(lin, _LINEAR_KEYS, "linear_attn_config.")
    kda = _get(lin, "kda_layers", list, "linear_attn_config.", default=None)
    full = _get(lin, "full_attn_layers", list, "linear_attn_config.")
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
        num_heads=_positive(_get(lin, "num_heads", int, p), p + "num_heads"),
        head_dim=_positive(_get(lin, "head_dim", int, p), p + "head_dim"),
        conv_kernel_size=_positive(
            _get(lin, "short_conv_kernel_size", int, p, default=4), p + "short_conv_kernel_size"
        ),
    )


def _mla_spec(cfg: dict[str, Any]) -> MLASpec:
    heads = _positive(_get(cfg, "num_attention_heads", int), "num_attention_heads")
    kv_heads = _get(cfg, "num_key_value_heads", int, default=heads)
    if kv_heads != heads:
        raise ConfigError("num_key_value_heads", f"MLA expands its latent to every head; expected {heads}")
    if _get(cfg, "rope_scaling", dict, default=None) is not None:
        raise ConfigError("rope_scaling", "rope scaling is not supported by this runtime")
    if _get(cfg, "attention_bias", bool, default=False):
        raise ConfigError("attention_bias", "MLA projections with bias are not supported")
    q_lora = _get(cfg, "q_lora_rank", int, default=None)
    if q_lora is not None:
        _positive(q_lora, "q_lora_rank")
    return MLASpec(
        num_heads=heads,
        q_lora_rank=q_lora,
        kv_lora_rank=_positive(_get(cfg, "kv_lora_rank", int), "kv_lora_rank"),
        qk_nope_head_dim=_positive(_get(cfg, "qk_nope_head_dim", int), "qk_nope_head_dim"),
        qk_rope_head_dim=_get(cfg, "qk_rope_head_dim", int),
        v_head_dim=_positive(_get(cfg, "v_head_dim", int), "v_head_dim"),
        use_rope=not _get(cfg, "mla_use_nope", bool, default=False),
        rope_theta=_get(cfg, "rope_theta", float, default=10000.0),
    )


def _moe_spec(cfg: dict[str, Any]) -> MoESpec | None:
    num_experts = _get(cfg, "num_experts", int, default=0)
    if num_experts == 0:
        return None
    act = _get(cfg, "moe_router_activation_func", str, default="sigmoid")
    if act != "sigmoid":
        raise ConfigError("moe_router_activation_func", f"only 'sigmoid' routing is supported, got {act!r}")
    spec = MoESpec(
        num_experts=_positive(num_experts, "num_experts"),
        top_k=_positive(_get(cfg, "num_experts_per_token", int), "num_experts_per_token"),
        intermediate_size=_positive(_get(cfg, "moe_intermediate_size", int), "moe_intermediate_size"),
        num_shared_experts=_get(cfg, "num_shared_experts", int, default=0),
        routed_scaling_factor=_get(cfg, "routed_scaling_factor", float, default=1.0),
        renormalize=_get(cfg, "moe_renormalize", bool, default=True),
        num_groups=_positive(_get(cfg, "num_expert_group", int, default=1), "num_expert_group"),
        topk_groups=_positive(_get(cfg, "topk_group", int, default=1), "topk_group"),
    )
    if spec.top_k > spec.num_experts:
        raise ConfigError("num_experts_per_token", f"{spec.top_k} exceeds num_experts={spec.num_experts}")
    if spec.num_experts % spec.num_groups:
        raise ConfigError(
            "num_expert_group", f"{spec.num_groups} does not divide num_experts={spec.num_experts}"
        )
    if spec.topk_groups > spec.num_groups:
        raise ConfigError("topk_group", f"{spec.topk_groups} exceeds num_expert_group={spec.num_groups}")
    if spec.num_groups > 1 and spec.num_experts // spec.num_groups < 2:
        raise ConfigError("num_expert_group", "group scores take the top-2 experts; groups need >= 2 experts")
    if spec.topk_groups * (spec.num_experts // spec.num_groups) < spec.top_k:
        raise ConfigError("topk_group", "the selected groups hold fewer experts than num_experts_per_token")
    return spec


def _dsa_spec(cfg: dict[str, Any], mla: MLASpec) -> DSASpec | None:
    present = [k for k in ("index_topk", "index_n_heads", "index_head_dim") if cfg.get(k) is not None]
    if not present:
        return None
    for key in ("index_topk", "index_n_heads", "index_head_dim"):
        if key not in present:
            raise ConfigError(
                key, f"DSA needs all of index_topk/index_n_heads/index_head_dim (got {present})"
            )
    spec = DSASpec(
        topk=_positive(_get(cfg, "index_topk", int), "index_topk"),
        num_heads=_positive(_get(cfg, "index_n_heads", int), "index_n_heads"),
        head_dim=_positive(_get(cfg, "index_head_dim", int), "index_head_dim"),
    )
    if mla.q_lora_rank is None:
        raise ConfigError("q_lora_rank", "the DSA indexer reads the query latent; set q_lora_rank")
    if mla.use_rope and spec.head_dim < mla.qk_rope_head_dim:
        raise ConfigError("index_head_dim", f"must be >= qk_rope_head_dim={mla.qk_rope_head_dim}")
    return spec


def _mlp_kinds(cfg: dict[str, Any], num_layers: int, moe: MoESpec | None) -> tuple[str, ...]:
    if moe is None:
        return (DENSE,) * num_layers
    first_dense = _get(cfg, "first_k_dense_replace", int, default=0)
    freq = _positive(_get(cfg, "moe_layer_freq", int, default=1), "moe_layer_freq")
    if not 0 <= first_dense <= num_layers:
        raise ConfigError("first_k_dense_replace", f"must be in 0..{num_layers}, got {first_dense}")
    return tuple(
        MOE if i >= first_dense and (i - first_dense) % freq == 0 else DENSE for i in range(num_layers)
    )


def _normalise_vision(raw: dict[str, Any]) -> dict[str, Any]:
    """Published spellings -> transformers spellings; variant selectors must name MoonViT's."""
    p = "vision_config."
    vcfg: dict[str, Any] = {}
    for key, value in raw.items():
        if key in _VISION_FIXED:
            if value != _VISION_FIXED[key]:
                raise ConfigError(p + key, f"only {_VISION_FIXED[key]!r} is supported, got {value!r}")
            continue
        name = _VISION_ALIASES.get(key, key)
        if name in vcfg and vcfg[name] != value:
            raise ConfigError(p + key, f"conflicts with {name}={vcfg[name]!r}")
        vcfg[name] = value
    _check_keys(vcfg, _VISION_KEYS, p)
    return vcfg


def _vision_spec(raw: dict[str, Any], wrapper: dict[str, Any], text_hidden: int) -> VisionSpec:
    vcfg = _normalise_vision(raw)
    p = "vision_config."
    act = _get(vcfg, "hidden_act", str, p, default="gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConfigError(p + "hidden_act", f"only 'gelu_pytorch_tanh' is supported, got {act!r}")
    merge = _get(vcfg, "merge_kernel_size", (list, tuple), p, default=[2, 2])
    if len(merge) != 2 or not all(isinstance(m, int) and m > 0 for m in merge):
        raise ConfigError(p + "merge_kernel_size", f"expected two positive ints, got {merge!r}")
    rope = _get(vcfg, "rope_parameters", dict, p, default={}) or {}
    theta = float(rope.get("rope_theta", vcfg.get("rope_theta", 10000.0)))
    spec = VisionSpec(
        patch_size=_positive(_get(vcfg, "patch_size", int, p, default=14), p + "patch_size"),
        hidden_size=_positive(_get(vcfg, "hidden_size", int, p), p + "hidden_size"),
        intermediate_size=_positive(_get(vcfg, "intermediate_size", int, p), p + "intermediate_size"),
        num_heads=_positive(_get(vcfg, "num_attention_heads", int, p), p + "num_attention_heads"),
        num_layers=_positive(_get(vcfg, "num_hidden_layers", int, p), p + "num_hidden_layers"),
        pos_emb_height=_positive(_get(vcfg, "pos_emb_height", int, p, default=64), p + "pos_emb_height"),
        pos_emb_width=_positive(_get(vcfg, "pos_emb_width", int, p, default=64), p + "pos_emb_width"),
        pos_emb_time=_positive(_get(vcfg, "pos_emb_time", int, p, default=4), p + "pos_emb_time"),
        merge_kernel=(int(merge[0]), int(merge[1])),
        rope_theta=theta,
        projector_ln_eps=_get(
            wrapper,
            "projection_layer_norm_eps",
            float,
            default=_get(vcfg, "projector_ln_eps", float, p, default=1e-5),
        ),
    )
    if spec.hidden_size % spec.num_heads or spec.head_dim % 4:
        raise ConfigError(p + "num_attention_heads", "head dim must be an integer multiple of 4 (2D rope)")
    for where, key in ((wrapper, "projection_hidden_size"), (vcfg, "mm_hidden_size")):
        if _get(where, key, int, default=spec.hidden_size) != spec.hidden_size:
            raise ConfigError(
                key, f"the projector normalises vision tokens: must equal hidden_size={spec.hidden_size}"
            )
    if _get(vcfg, "text_hidden_size", int, p, default=text_hidden) != text_hidden:
        raise ConfigError(p + "text_hidden_size", f"must equal the text model's hidden_size={text_hidden}")
    return spec


def _text_spec(cfg: dict[str, Any], prefix: str = "") -> ModelSpec:
    _check_keys(cfg, _TEXT_KEYS, prefix)
    model_type = _get(cfg, "model_type", str, default="kimi_linear")
    if model_type not in _TEXT_MODEL_TYPES:
        raise ConfigError(prefix + "model_type", f"unsupported text model type {model_type!r}")
    act = _get(cfg, "hidden_act", str, default="silu")
    if act != "silu":
        raise ConfigError(prefix + "hidden_act", f"only 'silu' is supported, got {act!r}")
    num_layers = _positive(_get(cfg, "num_hidden_layers", int), "num_hidden_layers")
    mla = _mla_spec(cfg)
    moe = _moe_spec(cfg)
    return ModelSpec(
        model_type=model_type,
        vocab_size=_positive(_get(cfg, "vocab_size", int), "vocab_size"),
        hidden_size=_positive(_get(cfg, "hidden_size", int), "hidden_size"),
        intermediate_size=_positive(_get(cfg, "intermediate_size", int), "intermediate_size"),
        num_layers=num_layers,
        layer_kinds=_layer_kinds(cfg, num_layers),
        mlp_kinds=_mlp_kinds(cfg, num_layers, moe),
        rms_norm_eps=_get(cfg, "rms_norm_eps", float, default=1e-5),
        tie_word_embeddings=_get(cfg, "tie_word_embeddings", bool, default=False),
        kda=_kda_spec(cfg),
        mla=mla,
        moe=moe,
        dsa=_dsa_spec(cfg, mla),
        torch_dtype=str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"),
    )


def parse_config(cfg: dict[str, Any]) -> ModelSpec:
    """Turn a parsed `config.json` into a `ModelSpec`; raises `ConfigError` naming the field."""
    if not isinstance(cfg, dict):
        raise ConfigError("<root>", "expected a JSON object")
    if "text_config" not in cfg:
        return _text_spec(cfg)
    _check_keys(cfg, _WRAPPER_KEYS, "")
    wrapper_type = _get(cfg, "model_type", str, default="kimi_k25")
    if wrapper_type not in _WRAPPER_MODEL_TYPES:
        raise ConfigError("model_type", f"unsupported multimodal model type {wrapper_type!r}")
    text = _text_spec(_get(cfg, "text_config", dict), "text_config.")
    vision_cfg = _get(cfg, "vision_config", dict, default=None)
    if vision_cfg is None:
        return text
    vision = _vision_spec(vision_cfg, cfg, text.hidden_size)
    image_token = _get(cfg, "image_token_id", int, default=None)
    if image_token is None:
        image_token = _get(cfg, "media_placeholder_token_id", int)
    if not 0 <= image_token < text.vocab_size:
        raise ConfigError("image_token_id", f"{image_token} is outside the vocabulary of {text.vocab_size}")
    return replace(text, vision=vision, image_token_id=image_token)


def load_config(path: str | Path) -> ModelSpec:
    """Read `path` (a `config.json`, or a folder holding one) and parse it."""
    p = Path(path)
    if p.is_dir():
        p = p / "config.json"
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError("<file>", f"cannot read {p}: {exc}") from exc
    return parse_config(data)

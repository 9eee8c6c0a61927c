"""Multimodal wrappers (`kimi_k25`, `kimi_vl`, `kimi_k3`): a `text_config` of any text family
plus a MoonViT `vision_config` (patch 14, merge 2x2) with its projector, as the K2.5 release ships.
Published MoonViT spellings (`vt_*`, `init_pos_emb_*`) are read as transformers' names."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from inference.config.fields import check_keys, get, keys, positive
from inference.config.spec import ConfigError, ModelSpec, VisionSpec

__all__ = ["MODEL_TYPES", "read"]

MODEL_TYPES = ("kimi_k25", "kimi_vl", "kimi_k3")

_VISION_KEYS = keys(
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
    check_keys(vcfg, _VISION_KEYS, p, {})
    return vcfg


def _vision_spec(raw: dict[str, Any], wrapper: dict[str, Any], text_hidden: int) -> VisionSpec:
    vcfg = _normalise_vision(raw)
    p = "vision_config."
    act = get(vcfg, "hidden_act", str, p, default="gelu_pytorch_tanh")
    if act != "gelu_pytorch_tanh":
        raise ConfigError(p + "hidden_act", f"only 'gelu_pytorch_tanh' is supported, got {act!r}")
    merge = get(vcfg, "merge_kernel_size", (list, tuple), p, default=[2, 2])
    if len(merge) != 2 or not all(isinstance(m, int) and m > 0 for m in merge):
        raise ConfigError(p + "merge_kernel_size", f"expected two positive ints, got {merge!r}")
    rope = get(vcfg, "rope_parameters", dict, p, default={}) or {}
    theta = float(rope.get("rope_theta", vcfg.get("rope_theta", 10000.0)))
    spec = VisionSpec(
        patch_size=positive(get(vcfg, "patch_size", int, p, default=14), p + "patch_size"),
        hidden_size=positive(get(vcfg, "hidden_size", int, p), p + "hidden_size"),
        intermediate_size=positive(get(vcfg, "intermediate_size", int, p), p + "intermediate_size"),
        num_heads=positive(get(vcfg, "num_attention_heads", int, p), p + "num_attention_heads"),
        num_layers=positive(get(vcfg, "num_hidden_layers", int, p), p + "num_hidden_layers"),
        pos_emb_height=positive(get(vcfg, "pos_emb_height", int, p, default=64), p + "pos_emb_height"),
        pos_emb_width=positive(get(vcfg, "pos_emb_width", int, p, default=64), p + "pos_emb_width"),
        pos_emb_time=positive(get(vcfg, "pos_emb_time", int, p, default=4), p + "pos_emb_time"),
        merge_kernel=(int(merge[0]), int(merge[1])),
        rope_theta=theta,
        projector_ln_eps=get(
            wrapper,
            "projection_layer_norm_eps",
            float,
            default=get(vcfg, "projector_ln_eps", float, p, default=1e-5),
        ),
    )
    if spec.hidden_size % spec.num_heads or spec.head_dim % 4:
        raise ConfigError(p + "num_attention_heads", "head dim must be an integer multiple of 4 (2D rope)")
    for where, key in ((wrapper, "projection_hidden_size"), (vcfg, "mm_hidden_size")):
        if get(where, key, int, default=spec.hidden_size) != spec.hidden_size:
            raise ConfigError(
                key, f"the projector normalises vision tokens: must equal hidden_size={spec.hidden_size}"
            )
    if get(vcfg, "text_hidden_size", int, p, default=text_hidden) != text_hidden:
        raise ConfigError(p + "text_hidden_size", f"must equal the text model's hidden_size={text_hidden}")
    return spec


_WRAPPER_KEYS = keys(
    "model_type text_config vision_config projection_hidden_size projection_layer_norm_eps "
    "image_token_id media_placeholder_token_id"
)
_WRAPPER_IGNORED = {
    **dict.fromkeys(
        ("video_token_id", "vision_start_token_id", "vision_end_token_id"),
        "marker token ids the tokenizer and chat template place; images enter as image_token_id",
    ),
    "image_placeholder": "chat-template string",
    "video_placeholder": "chat-template string",
    "use_unified_vision_chunk": "video chunking of the processor (this runtime takes images)",
    "ignore_index": "label padding of the training loss",
    "tie_word_embeddings": "the text_config's value is the one read",
}


def read(cfg: dict[str, Any], read_text: Callable[[dict[str, Any], str], ModelSpec]) -> ModelSpec:
    """`read_text(text_config, prefix)` parses the text model of whichever family it names."""
    check_keys(cfg, _WRAPPER_KEYS, "", _WRAPPER_IGNORED)
    wrapper_type = get(cfg, "model_type", str, default="kimi_k25")
    if wrapper_type not in MODEL_TYPES:
        raise ConfigError("model_type", f"unsupported multimodal model type {wrapper_type!r}")
    text = replace(read_text(get(cfg, "text_config", dict), "text_config."), wrapper_type=wrapper_type)
    vision_cfg = get(cfg, "vision_config", dict, default=None)
    if vision_cfg is None:
        return text
    vision = _vision_spec(vision_cfg, cfg, text.hidden_size)
    image_token = get(cfg, "image_token_id", int, default=None)
    if image_token is None:
        image_token = get(cfg, "media_placeholder_token_id", int)
    if not 0 <= image_token < text.vocab_size:
        raise ConfigError("image_token_id", f"{image_token} is outside the vocabulary of {text.vocab_size}")
    return replace(text, vision=vision, image_token_id=image_token)

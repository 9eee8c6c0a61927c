"""Typed field access shared by the readers: every refusal names the published field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from inference.config.spec import ConfigError

__all__ = ["METADATA", "check_keys", "fixed", "get", "keys", "positive"]


def keys(names: str) -> frozenset[str]:
    return frozenset(names.split())


# Known and ignored in every family, with the reason: provenance, generation defaults, training
# knobs and loader hints. None of them changes the function the served model computes.
METADATA: Mapping[str, str] = {
    **dict.fromkeys(keys("architectures auto_map transformers_version _name_or_path _commit_hash"), "provenance"),
    **dict.fromkeys(keys("bos_token_id eos_token_id pad_token_id"), "tokenizer ids (read from the tokenizer)"),
    **dict.fromkeys(keys("dtype torch_dtype"), "weight dtype, read separately as torch_dtype"),
    **dict.fromkeys(keys("max_position_embeddings model_max_length"), "trained context length: analysis only (ModelSpec.max_position_embeddings); --max-model-len sets the served limit"),
    **dict.fromkeys(keys("use_cache output_router_logits _attn_implementation"), "runtime switches of transformers"),
    **dict.fromkeys(keys("initializer_range"), "initialisation of untrained weights"),
    **dict.fromkeys(keys("attention_dropout"), "dropout: training only"),
    **dict.fromkeys(keys("aux_loss_alpha seq_aux router_aux_loss_coef"), "MoE balance loss: training only"),
    "pretraining_tp": "tensor-parallel degree used in pre-training; the math is the same at any split",
    "ep_size": "expert-parallel degree of the training run; dayzero analyze plans its own",
}  # fmt: skip


def check_keys(
    cfg: Mapping[str, Any], allowed: frozenset[str], prefix: str, ignored: Mapping[str, str]
) -> None:
    """Refuse any key that is neither read (`allowed`) nor known-and-ignored (`ignored`, METADATA)."""
    for key in cfg:
        if key not in allowed and key not in ignored and key not in METADATA:
            raise ConfigError(f"{prefix}{key}", "unknown field (not understood by this runtime)")


def get(
    cfg: Mapping[str, Any], key: str, kind: type | tuple[type, ...], prefix: str = "", **default: Any
) -> Any:
    """`cfg[key]` checked against `kind`; `default=...` makes it optional (null counts as missing)."""
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


def positive(value: int, field: str) -> int:
    if value <= 0:
        raise ConfigError(field, f"must be positive, got {value}")
    return value


def fixed(cfg: Mapping[str, Any], key: str, allowed: tuple[Any, ...], prefix: str = "") -> None:
    """A variant selector: absent, or one of the values this runtime implements."""
    if cfg.get(key) is not None and cfg[key] not in allowed:
        raise ConfigError(
            prefix + key, f"only {' / '.join(map(repr, allowed))} is supported, got {cfg[key]!r}"
        )

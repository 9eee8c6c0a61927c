"""Parse a Hugging Face `config.json` of the family into one frozen `ModelSpec`.

One reader per published layout, chosen by `model_type`:

* `kimi_linear` (`kimi_linear.py`): KDA + NoPE MLA + MoE, optional DSA fields;
* `deepseek_v3`, `deepseek_v32`, `kimi_k2` (`deepseek.py`): MLA with `q_lora_rank` and rope,
  the DSA indexer for V3.2, grouped sigmoid routing, MTP layers noted;
* `qwen3_next` (`qwen3_next.py`): gated DeltaNet + gated GQA attention + softmax MoE;
* `kimi_k25`, `kimi_vl`, `kimi_k3` (`multimodal.py`): `text_config` (any of the above) +
  MoonViT `vision_config`.

Unknown keys and inconsistent values raise `ConfigError` naming the field: a config we would
silently misread is worse than one we refuse. Keys a reader knows and deliberately ignores are
listed with their reason (`fields.METADATA` and each reader's `_IGNORED`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from inference.config import deepseek, kimi_linear, multimodal, qwen3_next
from inference.config.fields import get, positive
from inference.config.spec import (
    DENSE,
    GDN,
    GQA,
    KDA,
    MLA,
    MOE,
    ConfigError,
    DSASpec,
    GDNSpec,
    GQASpec,
    KDASpec,
    MLASpec,
    ModelSpec,
    MoESpec,
    MTPSpec,
    QuantSpec,
    VisionSpec,
)

__all__ = [
    "DENSE",
    "GDN",
    "GQA",
    "KDA",
    "MLA",
    "MOE",
    "TEXT_MODEL_TYPES",
    "ConfigError",
    "DSASpec",
    "GDNSpec",
    "GQASpec",
    "KDASpec",
    "MLASpec",
    "MTPSpec",
    "MoESpec",
    "ModelSpec",
    "QuantSpec",
    "VisionSpec",
    "load_config",
    "parse_config",
]

_TEXT_READERS: dict[str, Callable[[dict[str, Any], str], ModelSpec]] = {
    **dict.fromkeys(kimi_linear.MODEL_TYPES, kimi_linear.read),
    **dict.fromkeys(deepseek.MODEL_TYPES, deepseek.read),
    **dict.fromkeys(qwen3_next.MODEL_TYPES, qwen3_next.read),
}
TEXT_MODEL_TYPES = tuple(_TEXT_READERS)


def _read_text(cfg: dict[str, Any], prefix: str = "") -> ModelSpec:
    model_type = cfg.get("model_type", "kimi_linear")  # early Kimi-Linear exports omit it
    reader = _TEXT_READERS.get(model_type) if isinstance(model_type, str) else None
    if reader is None:
        raise ConfigError(
            prefix + "model_type",
            f"unsupported text model type {model_type!r} (known: {', '.join(TEXT_MODEL_TYPES)})",
        )
    spec = reader(cfg, prefix)
    trained = get(cfg, "max_position_embeddings", int, prefix, default=None)  # every family's name
    if trained is not None:
        positive(trained, prefix + "max_position_embeddings")
    return replace(spec, max_position_embeddings=trained)


def parse_config(cfg: dict[str, Any]) -> ModelSpec:
    """Turn a parsed `config.json` into a `ModelSpec`; raises `ConfigError` naming the field."""
    if not isinstance(cfg, dict):
        raise ConfigError("<root>", "expected a JSON object")
    if "text_config" in cfg:
        return multimodal.read(cfg, _read_text)
    return _read_text(cfg)


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

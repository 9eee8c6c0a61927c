"""The bundled tiny `qwen3_next` config and the published <-> transformers-5 name map (the routed
experts fused as for DeepSeek; every other name is shared)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from testing.deepseek_hf_mapping import published_to_hf

TINY = Path(__file__).resolve().parents[1] / "inference" / "configs" / "tiny_qwen3_next.json"

__all__ = ["TINY", "hf_config", "published_to_hf", "tiny_qwen3_next_config"]


def tiny_qwen3_next_config(**overrides: Any) -> dict[str, Any]:
    return {**json.loads(TINY.read_text()), **overrides}


def hf_config(cfg: dict[str, Any]):
    """transformers' `Qwen3NextConfig` of a published config (eager attention, for the CPU)."""
    import transformers

    hc = transformers.Qwen3NextConfig(
        **{k: v for k, v in cfg.items() if k not in ("architectures", "torch_dtype")}
    )
    hc._attn_implementation = "eager"
    return hc

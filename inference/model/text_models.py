"""Which model class serves a parsed config, and what the model code refuses to serve.

One place for the decision: `build_model` and the multimodal wrapper both ask here.
"""

from __future__ import annotations

from inference.config import ModelSpec
from inference.model.deepseek_v32 import DeepseekForCausalLM, mtp_prefixes
from inference.model.kimi_linear import KimiLinearForCausalLM
from inference.model.qwen3_next import Qwen3NextForCausalLM

__all__ = ["NotServableError", "check_servable", "ignored_prefixes", "text_model_class"]

_CLASSES: dict[str, type[KimiLinearForCausalLM]] = {
    "kimi_linear": KimiLinearForCausalLM,
    "deepseek_v3": DeepseekForCausalLM,
    "deepseek_v32": DeepseekForCausalLM,
    "kimi_k2": DeepseekForCausalLM,
    "qwen3_next": Qwen3NextForCausalLM,
}


class NotServableError(ValueError):
    """The config parses (so `dayzero analyze` reads it) but the model code cannot run it."""


def check_servable(spec: ModelSpec) -> None:
    """Raise `NotServableError` naming what is missing; analysis-only features end here."""
    if spec.model_type not in _CLASSES:
        raise NotServableError(
            f"no model code for model_type {spec.model_type!r} (served: {', '.join(sorted(_CLASSES))}); "
            "`dayzero analyze` reads it and `--diff` lists the operators to build"
        )
    if spec.gdn is not None and spec.gdn.k_head_dim != spec.gdn.v_head_dim:
        raise NotServableError(
            "gated DeltaNet states live in square [K, K] state slots: needs linear_key_head_dim == linear_value_head_dim"
        )


def text_model_class(spec: ModelSpec) -> type[KimiLinearForCausalLM]:
    check_servable(spec)
    return _CLASSES[spec.model_type]


def ignored_prefixes(spec: ModelSpec) -> tuple[str, ...]:
    """Checkpoint tensor-name prefixes of layers the served model does not build (MTP)."""
    if spec.model_type == "qwen3_next":
        return ("mtp.",)  # the Qwen3-Next checkpoints ship their MTP module under mtp.*
    return mtp_prefixes(spec)

"""Which model class serves a parsed config, and what the model code refuses to serve.

One place for the decision: `build_model` and the multimodal wrapper both ask here.
"""

from __future__ import annotations

from inference.config import ModelSpec
from inference.model.deepseek_v32 import DeepseekForCausalLM
from inference.model.kimi_linear import KimiLinearForCausalLM

__all__ = ["NotServableError", "check_servable", "text_model_class"]

_CLASSES: dict[str, type[KimiLinearForCausalLM]] = {
    "kimi_linear": KimiLinearForCausalLM,
    "deepseek_v3": DeepseekForCausalLM,
    "deepseek_v32": DeepseekForCausalLM,
    "kimi_k2": DeepseekForCausalLM,
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
    if spec.mla is not None and spec.mla.rope_scaling is not None:
        raise NotServableError("rope_scaling (YaRN) is not implemented by the MLA layer; remove it to serve")


def text_model_class(spec: ModelSpec) -> type[KimiLinearForCausalLM]:
    check_servable(spec)
    return _CLASSES[spec.model_type]

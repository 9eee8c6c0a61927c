"""Build a model from a spec: random weights (`load_format="dummy"`) or a checkpoint folder."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from inference.config import ModelSpec
from inference.model.kimi_linear import KimiLinearForCausalLM
from inference.model.multimodal import KimiVLForConditionalGeneration
from inference.model.text_models import ignored_prefixes, text_model_class

__all__ = ["build_model", "dummy_tensor_values", "init_dummy_weights"]

LOAD_FORMATS = ("dummy", "safetensors")


@torch.no_grad()
def init_dummy_weights(model: nn.Module, seed: int = 0) -> None:
    """Deterministic random weights that keep activations O(1) at any width.

    Linear/conv weights ~ N(0, 1/fan_in), embeddings ~ N(0, 1), norm scales ~ U(0.5, 1.5), biases
    and the router correction ~ N(0, 0.1); KDA decay parameters as fla initialises them. Projections
    that write into the residual stream (`o_proj`, `down_proj`, `w2`) are scaled by
    `1/sqrt(2 * num_layers)` (GPT-2 style): without it a random deep model is chaotic, and bf16
    rounding alone moves its logits by tens of percent. Every tensor is drawn on the CPU from one
    generator, so the same seed gives the same model anywhere.
    """
    gen = torch.Generator().manual_seed(seed)
    for _name, tensor, value in dummy_tensor_values(model, gen):
        tensor.copy_(value.to(tensor.dtype))
    for module in model.modules():  # recurrent mixers draw their decay parameters their own way
        init = getattr(module, "init_dummy", None)
        if callable(init):
            init(gen)


def dummy_tensor_values(
    model: nn.Module, gen: torch.Generator
) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """`(name, tensor, fp32 value)` of every parameter and buffer but the recurrent decays, in the
    order `init_dummy_weights` draws them. Reads only names and shapes: a meta-device model gives
    the values a sharded rank slices its part from (the same random model at any world size)."""
    num_layers = sum(1 for name, _ in model.named_modules() if name.endswith("input_layernorm"))
    residual_scale = (2 * max(num_layers, 1)) ** -0.5
    for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
        if name.endswith(("A_log", "dt_bias")):
            continue
        shape = tensor.shape
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "e_score_correction_bias" or leaf == "bias":
            value = torch.randn(shape, generator=gen) * 0.1
        elif tensor.dim() == 1:  # norm scales
            value = torch.rand(shape, generator=gen) + 0.5
        elif "embed_tokens" in name or "pos_emb" in name:
            value = torch.randn(shape, generator=gen)
        else:
            fan_in = shape[1:].numel() if tensor.dim() > 1 else 1
            value = torch.randn(shape, generator=gen) / fan_in**0.5
            if name.endswith(("o_proj.weight", "down_proj.weight", "w2.weight")) and "vision" not in name:
                value = value * residual_scale
        yield name, tensor, value


def build_model(
    spec: ModelSpec,
    *,
    load_format: str = "dummy",
    path: str | Path | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    seed: int = 0,
    verify_checksums: bool = True,
    progress: bool = False,
) -> nn.Module:
    """A ready-to-run model in eval mode: text-only, or with the vision tower when the spec has one.

    Args:
        spec: parsed config.
        load_format: "dummy" (seeded random weights) or "safetensors" (read `path`).
        path: checkpoint folder for "safetensors".
        dtype, device: where the weights live. KDA decay parameters stay fp32.
        seed: random seed for "dummy".
        verify_checksums: check the SHA-256 manifest before loading (when one is present).
        progress: show a progress bar while loading.
    """
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    # refuses what the model code cannot run (NotServableError) before anything is allocated
    cls = KimiVLForConditionalGeneration if spec.vision is not None else text_model_class(spec)
    if load_format == "safetensors" and path is None:
        raise ValueError("load_format='safetensors' needs a path")
    # Shapes on the meta device, then storage allocated once, in the target dtype, where it runs:
    # a 48B checkpoint never needs an fp32 copy in host memory.
    with torch.device("meta"):
        model = cls(spec)
    _cast(model, dtype)
    model = model.to_empty(device=device)
    for module in model.modules():  # to_empty gives every module its own tensors: tie again
        if isinstance(module, KimiLinearForCausalLM):
            module.tie_weights()
    if load_format == "dummy":
        init_dummy_weights(model, seed)
    else:
        from inference.loader import load_weights

        load_weights(
            model, path, verify=verify_checksums, progress=progress, ignore_prefixes=ignored_prefixes(spec),
            quantization=spec.quantization,
        )  # fmt: skip
    return model.eval()


def _cast(model: nn.Module, dtype: torch.dtype) -> None:
    """Cast floating parameters to `dtype`, keeping KDA's decay parameters in fp32."""
    for name, p in model.named_parameters():
        keep = name.endswith(("A_log", "dt_bias"))
        p.data = p.data.to(torch.float32 if keep else dtype)
    for _name, b in model.named_buffers():
        if b.is_floating_point():  # router correction bias: fp32 like the router itself
            b.data = b.data.float()

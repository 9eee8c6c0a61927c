"""Build one rank's shard of a model: meta shapes, sharded, then only the shard is allocated.

Dummy weights are the same random model at any world size: every rank walks the full-size meta
model in `init_dummy_weights`'s order, draws each tensor from the one seeded generator and keeps
its slice (a full tensor exists only one at a time, on the CPU). Checkpoints load each tensor's
slice straight from the safetensors file (`load_weights_sharded`).

A vision-language model is split in two: the ranks hold its language model (the checkpoint's and
the full model's `language_model.*`, sharded as a text model) and the driver holds the vision
tower and projector whole (`build_vision_encoder`), whose embeddings it sends with each request.
Both draw their dummy weights from the whole model's sequence, so they are TP=1's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from inference.analyze.stages import StagePlan, plan_stages
from inference.config import ModelSpec
from inference.loader import copy_shard, load_weights_sharded
from inference.model.factory import _cast, dummy_tensor_values
from inference.model.multimodal import KimiVLForConditionalGeneration, VisionEncoder
from inference.model.text_models import ignored_prefixes, text_model_class
from inference.parallel.comm import MeshGroups
from inference.parallel.config import ParallelConfig
from inference.parallel.sharding import ShardPlan, shard_model

__all__ = [
    "LANGUAGE_MODEL_PREFIX",
    "build_sharded_model",
    "build_vision_encoder",
    "fill_dummy_shard",
    "rank_weight_bytes",
]

LANGUAGE_MODEL_PREFIX = "language_model."  # a vision-language model's text model, in the checkpoint
VISION_PREFIXES = ("vision_tower.", "mm_projector.")  # its image side, held by the driver


def _meta_model(spec: ModelSpec, dtype: torch.dtype) -> nn.Module:
    with torch.device("meta"):
        model = text_model_class(spec)(spec)
    _cast(model, dtype)
    return model


def _meta_full(spec: ModelSpec, dtype: torch.dtype) -> nn.Module:
    """The whole model as TP=1 builds it (the order its dummy weights are drawn in)."""
    if spec.vision is None:
        return _meta_model(spec, dtype)
    with torch.device("meta"):
        model = KimiVLForConditionalGeneration(spec)
    _cast(model, dtype)
    return model


def _rank_prefix(spec: ModelSpec) -> str:
    return LANGUAGE_MODEL_PREFIX if spec.vision is not None else ""


@torch.no_grad()
def fill_dummy_shard(model: nn.Module, full: nn.Module, plan: ShardPlan, seed: int, prefix: str = "") -> None:
    """The slices of `init_dummy_weights(full, seed)` this rank holds, copied into `model`; with
    `prefix`, `model` is `full`'s submodule of that name (the others' values are drawn, not kept)."""
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))

    def put(name: str, value: torch.Tensor) -> None:
        if not name.startswith(prefix):
            return
        name = name[len(prefix) :]
        if name in plan.elsewhere:
            return
        dst = targets[name]
        if name in plan.slices:
            dim, start, stop = plan.slices[name]
            copy_shard(dst, value.narrow(dim, start, stop - start), dim, name)
        else:
            dst.copy_(value.to(dst.dtype))

    gen = torch.Generator().manual_seed(seed)
    for name, _, value in dummy_tensor_values(full, gen):
        put(name, value)
    for path, module in full.named_modules():
        draw = getattr(module, "dummy_params", None)
        if callable(draw):
            for leaf, value in draw(gen).items():
                put(f"{path}.{leaf}", value)
        elif callable(getattr(module, "init_dummy", None)):
            raise TypeError(f"{type(module).__name__} draws its dummy weights in place: not shardable")


def rank_weight_bytes(spec: ModelSpec, config: ParallelConfig, dtype: torch.dtype, rank: int = 0) -> int:
    """Bytes of `rank`'s parameters and buffers, from its shard built on the meta device (nothing
    allocated): the runtime's own figure to set beside `dayzero analyze`'s per-GPU weights."""
    mesh = MeshGroups.layout_only(config, rank)
    model, _ = _meta_shard(spec, mesh, dtype, plan_stages(spec, config.pipeline_parallel_size))
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def _names(model: nn.Module) -> list[str]:
    return [n for n, _ in (*model.named_parameters(), *model.named_buffers())]


def _meta_shard(
    spec: ModelSpec, mesh: MeshGroups, dtype: torch.dtype, stages: StagePlan
) -> tuple[nn.Module, ShardPlan]:
    """This rank's shard on the meta device: its TP/EP slices of its pipeline stage's layers."""
    from inference.parallel.pipeline import cut_stage

    model = _meta_model(spec, dtype)
    full = _names(model)
    plan = shard_model(model, mesh)
    if stages.num_stages > 1:
        cut_stage(model, full, stages, mesh.pp.index, plan.elsewhere)
    return model, plan


def build_sharded_model(
    spec: ModelSpec,
    mesh: MeshGroups,
    *,
    load_format: str,
    path: str | Path | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
    stages: StagePlan | None = None,
) -> nn.Module:
    """This rank's model in eval mode (the checkpoint's manifest is checked by the driver);
    with `stages`, only its pipeline stage's part (`pipeline.cut_stage`)."""
    model, plan = _meta_shard(spec, mesh, dtype, stages or plan_stages(spec, 1))
    model = model.to_empty(device=device)
    if model.lm_head is not None:  # a stage before the last has none
        model.tie_weights()
    prefix = _rank_prefix(spec)
    if load_format == "dummy":
        fill_dummy_shard(model, _meta_full(spec, dtype), plan, seed, prefix)
    else:
        ignore = ignored_prefixes(spec) + (VISION_PREFIXES if prefix else ())
        load_weights_sharded(model, path, plan.slices, plan.elsewhere, ignore_prefixes=ignore, prefix=prefix)
    return model.eval()


def build_vision_encoder(
    spec: ModelSpec,
    *,
    load_format: str,
    path: str | Path | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> VisionEncoder:
    """The driver's tower and projector, whole (eval mode): TP=1's weights, from the checkpoint's
    `vision_tower.*` / `mm_projector.*` or drawn from the whole model's dummy sequence."""
    with torch.device("meta"):
        encoder = VisionEncoder(spec)
    _cast(encoder, dtype)
    encoder = encoder.to_empty(device=device)
    if load_format == "dummy":
        full = _meta_full(spec, dtype)
        text = {
            n
            for n, _ in [*full.named_parameters(), *full.named_buffers()]
            if n.startswith(LANGUAGE_MODEL_PREFIX)
        }
        fill_dummy_shard(encoder, full, ShardPlan(elsewhere=text), seed)
    else:
        from inference.loader import load_weights

        load_weights(
            encoder,
            path,
            verify=False,
            ignore_prefixes=(LANGUAGE_MODEL_PREFIX,),
            quantization=spec.quantization,
        )  # the driver verified the manifest already
    return encoder.eval()

"""Build one rank's shard of a model: meta shapes, sharded, then only the shard is allocated.

Dummy weights are the same random model at any world size: every rank walks the full-size meta
model in `init_dummy_weights`'s order, draws each tensor from the one seeded generator and keeps
its slice (a full tensor exists only one at a time, on the CPU). Checkpoints load each tensor's
slice straight from the safetensors file (`load_weights_sharded`).
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from inference.config import ModelSpec
from inference.loader import copy_shard, load_weights_sharded
from inference.model.factory import _cast, dummy_tensor_values
from inference.model.text_models import ignored_prefixes, text_model_class
from inference.parallel.comm import MeshGroups
from inference.parallel.config import ParallelConfig
from inference.parallel.sharding import ShardPlan, shard_model

__all__ = ["build_sharded_model", "fill_dummy_shard", "rank_weight_bytes"]


def _meta_model(spec: ModelSpec, dtype: torch.dtype) -> nn.Module:
    with torch.device("meta"):
        model = text_model_class(spec)(spec)
    _cast(model, dtype)
    return model


@torch.no_grad()
def fill_dummy_shard(model: nn.Module, full: nn.Module, plan: ShardPlan, seed: int) -> None:
    """The slices of `init_dummy_weights(full, seed)` this rank holds, copied into `model`."""
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))

    def put(name: str, value: torch.Tensor) -> None:
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
    for prefix, module in full.named_modules():
        draw = getattr(module, "dummy_params", None)
        if callable(draw):
            for leaf, value in draw(gen).items():
                put(f"{prefix}.{leaf}", value)
        elif callable(getattr(module, "init_dummy", None)):
            raise TypeError(f"{type(module).__name__} draws its dummy weights in place: not shardable")


def rank_weight_bytes(spec: ModelSpec, config: ParallelConfig, dtype: torch.dtype, rank: int = 0) -> int:
    """Bytes of `rank`'s parameters and buffers, from its shard built on the meta device (nothing
    allocated): the runtime's own figure to set beside `dayzero analyze`'s per-GPU weights."""
    model = _meta_model(spec, dtype)
    shard_model(model, MeshGroups.layout_only(config, rank))
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def build_sharded_model(
    spec: ModelSpec,
    mesh: MeshGroups,
    *,
    load_format: str,
    path: str | Path | None,
    dtype: torch.dtype,
    device: torch.device,
    seed: int,
) -> nn.Module:
    """This rank's model in eval mode (the checkpoint's manifest is checked by the driver)."""
    model = _meta_model(spec, dtype)
    plan = shard_model(model, mesh)
    model = model.to_empty(device=device)
    model.tie_weights()
    if load_format == "dummy":
        fill_dummy_shard(model, _meta_model(spec, dtype), plan, seed)
    else:
        load_weights_sharded(model, path, plan.slices, plan.elsewhere, ignore_prefixes=ignored_prefixes(spec))
    return model.eval()

"""Quantized checkpoints served as published: their weights dequantized at load to the serving dtype.

Two published formats (the config's `quantization_config`, parsed into `QuantSpec`):

* **DeepSeek block FP8** (DeepSeek-V3/V3.1/V3.2, Kimi-K2-Instruct): a linear's `X.weight` is
  float8_e4m3fn `[rows, cols]` and `X.weight_scale_inv` fp32 `[ceil(rows/128), ceil(cols/128)]`
  holds the multiplier of each 128 x 128 tile (the last row/column of tiles may be partial):
  `w = fp8 * scale_inv[r // 128, c // 128]`. Tensors without a `weight_scale_inv` (norms,
  embeddings, the router) are stored in bf16 and pass through.
* **compressed-tensors INT4 `pack-quantized`** (Kimi-K2-Thinking, K2.5: the routed experts):
  `X.weight_packed` int32 `[rows, ceil(cols/8)]` holds eight 4-bit values per int32, value `j`
  of the eight in bits `4j..4j+3`, stored as `q + 8` for `q` in [-8, 7]; `X.weight_scale`
  `[rows, ceil(cols/group)]` scales each `group` consecutive input columns; `X.weight_shape`
  is `[rows, cols]`. Symmetric: `w = q * scale[r, c // group]`.

The checkpoint itself says which tensors are quantized (a weight with its companions); the
config gives the tile / group size, which the companion shapes cannot pin down when a dimension
is not a multiple of it. The loader's one hook is `QuantizedCheckpoint.view`: per shard, the
names of the weights it fills and a handle whose `get_tensor` returns them dequantized (fp32;
the loader casts to the parameter's dtype), computed on the model's device. Companions in another
shard are read from there.

Why dequantize at load: the engine's GEMMs, the fused MoE and the CUDA graphs all run on the
serving dtype; quantized GEMMs are a kernel project of their own, not a loading step.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from pathlib import Path
from typing import Protocol

import torch
import torch.nn.functional as F
from safetensors import safe_open
from torch import Tensor

from inference.config import QuantSpec
from inference.weight_errors import WeightLoadError

__all__ = [
    "QuantizedCheckpoint",
    "dequantize_fp8_block",
    "dequantize_int4_packed",
    "unpack_int4",
]

FP8_SCALE = "weight_scale_inv"
INT4_PIECES = ("weight_packed", "weight_scale", "weight_shape")
_ALL_SUFFIXES = (FP8_SCALE, *INT4_PIECES, "weight_zero_point", "weight_g_idx")
_INT4_SHIFTS = torch.arange(0, 32, 4, dtype=torch.int32)  # value j of eight sits in bits 4j..4j+3


class _TensorFile(Protocol):
    def get_tensor(self, name: str) -> Tensor: ...


def dequantize_fp8_block(weight: Tensor, scale_inv: Tensor, block: tuple[int, int]) -> Tensor:
    """fp8 `[rows, cols]` times its per-tile scales (`[ceil(rows/br), ceil(cols/bc)]`) -> fp32."""
    if weight.dim() != 2:
        raise ValueError(f"FP8 block weights are 2-D, got shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    br, bc = block
    want = (math.ceil(rows / br), math.ceil(cols / bc))
    if tuple(scale_inv.shape) != want:
        raise ValueError(
            f"scale grid {tuple(scale_inv.shape)} != {want} for {rows}x{cols} in {br}x{bc} tiles"
        )
    # tiles as a [R, br, C, bc] view times the [R, 1, C, 1] scales: no full-size scale tensor
    x = weight.float()
    if (want[0] * br, want[1] * bc) != (rows, cols):
        x = F.pad(x, (0, want[1] * bc - cols, 0, want[0] * br - rows))
    x = x.view(want[0], br, want[1], bc) * scale_inv.to(x.device, torch.float32)[:, None, :, None]
    return x.view(want[0] * br, want[1] * bc)[:rows, :cols]


def unpack_int4(packed: Tensor, cols: int) -> Tensor:
    """int32 `[rows, ceil(cols/8)]` -> int8 `[rows, cols]` in [-8, 7]."""
    nibbles = (packed.unsqueeze(-1) >> _INT4_SHIFTS.to(packed.device)) & 0xF  # mask drops the sign fill
    return (nibbles.reshape(packed.shape[0], -1)[:, :cols] - 8).to(torch.int8)


def dequantize_int4_packed(packed: Tensor, scale: Tensor, shape: tuple[int, int], group_size: int) -> Tensor:
    """compressed-tensors symmetric group INT4 -> fp32 `shape`."""
    rows, cols = shape
    if packed.dtype != torch.int32 or tuple(packed.shape) != (rows, math.ceil(cols / 8)):
        raise ValueError(
            f"weight_packed {packed.dtype} {tuple(packed.shape)} does not hold {rows}x{cols} int4"
        )
    if tuple(scale.shape) != (rows, math.ceil(cols / group_size)):
        raise ValueError(f"weight_scale {tuple(scale.shape)} != groups of {group_size} over {rows}x{cols}")
    groups = scale.shape[1]
    x = unpack_int4(packed, cols).float()
    if groups * group_size != cols:  # a partial last group: pad to whole groups, sliced off below
        x = F.pad(x, (0, groups * group_size - cols))
    x = x.view(rows, groups, group_size) * scale.to(x.device, torch.float32)[:, :, None]
    return x.view(rows, groups * group_size)[:, :cols]


class _DequantizingFile:
    """The loader's view of one shard: `get_tensor(weight name)` returns the weight dequantized."""

    def __init__(self, owner: QuantizedCheckpoint, f: _TensorFile, fname: str) -> None:
        self.owner, self.f, self.fname = owner, f, fname

    def _piece(self, name: str) -> Tensor:
        where = self.owner.where.get(name)
        if where is None:
            raise WeightLoadError(f"quantized weight needs '{name}', which the checkpoint does not hold")
        if where == self.fname:
            return self.f.get_tensor(name).to(self.owner.device)
        with safe_open(str(self.owner.root / where), framework="pt") as other:  # companion in another shard
            return other.get_tensor(name).to(self.owner.device)

    def get_tensor(self, name: str) -> Tensor:
        q, base = self.owner.quant, name.removesuffix("weight")
        try:
            if q.method == "int4" and base + "weight_packed" in self.owner.where:
                shape = tuple(int(x) for x in self._piece(base + "weight_shape").tolist())
                if len(shape) != 2:
                    raise ValueError(f"weight_shape {shape} is not 2-D")
                packed, scale = self._piece(base + "weight_packed"), self._piece(base + "weight_scale")
                return dequantize_int4_packed(packed, scale, shape, q.group_size)
            weight = self.f.get_tensor(name)
            if q.method == "fp8" and base + FP8_SCALE in self.owner.where:
                if weight.dtype != torch.float8_e4m3fn:
                    raise ValueError(f"has a {FP8_SCALE} but is stored as {weight.dtype}, not float8_e4m3fn")
                weight = weight.to(self.owner.device)  # a GPU dequantizes ~100x faster than one core
                return dequantize_fp8_block(weight, self._piece(base + FP8_SCALE), q.block)
        except ValueError as exc:
            raise WeightLoadError(f"quantized tensor '{name}' in {self.fname}: {exc}") from exc
        if weight.dtype.itemsize == 1 and weight.is_floating_point():
            raise WeightLoadError(f"tensor '{name}' in {self.fname} is {weight.dtype} but has no {FP8_SCALE}")
        return weight


class QuantizedCheckpoint:
    """What the loader asks per shard; `quant=None` only checks that nothing is quantized."""

    def __init__(
        self,
        quant: QuantSpec | None,
        root: Path,
        shards: dict[str, list[str]],
        device: torch.device | str = "cpu",
    ) -> None:
        self.quant, self.root, self.device = quant, root, torch.device(device)  # dequantize where it runs
        self.where = {name: fname for fname, names in shards.items() for name in names}

    def view(self, f: _TensorFile, fname: str, names: Iterable[str]) -> tuple[_TensorFile, list[str]]:
        """(handle, names of the weights this shard fills): companions (scales, packed values,
        shapes) are folded into their weight; an INT4 weight is listed where its `weight_packed` is."""
        names = list(names)
        pieces = [n for n in names if n.rsplit(".", 1)[-1] in _ALL_SUFFIXES]
        if self.quant is None:
            if pieces:
                raise WeightLoadError(
                    f"{fname} holds quantized tensors ('{pieces[0]}', ...) but config.json has no "
                    "quantization_config: use the checkpoint's own config.json"
                )
            return f, names
        allowed = (FP8_SCALE,) if self.quant.method == "fp8" else INT4_PIECES
        out = [n for n in names if n not in pieces]
        for n in pieces:
            suffix = n.rsplit(".", 1)[-1]
            if suffix not in allowed:
                raise WeightLoadError(
                    f"tensor '{n}' in {fname} is not part of the {self.quant.method} format the config declares"
                )
            if suffix == "weight_packed":
                out.append(n.removesuffix("_packed"))
        return _DequantizingFile(self, f, fname), out

"""Weights: sharded safetensors via the index file, a SHA-256 manifest checked before use, dummy init.

Checkpoint folder layout (Hugging Face conventions):

* `model.safetensors` (one file) or `model-0000i-of-0000N.safetensors` + `model.safetensors.index.json`
  (`{"metadata": {"total_size": ...}, "weight_map": {tensor name: file}}`);
* optional `checksums.sha256.json`: `{"algorithm": "sha256", "files": {file name: hex digest}}`.
  When present, every file it lists is hashed before any tensor is read; one wrong byte refuses
  the load with an error naming the file.

Tensor names are the published checkpoint names, which are our module names, so no renaming
happens here; values are cast to the dtype of the parameter they fill.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from inference.quantized_weights import QuantizedCheckpoint
from inference.weight_errors import ChecksumError, WeightLoadError

if TYPE_CHECKING:
    from inference.config import QuantSpec

__all__ = [
    "INDEX_FILE",
    "MANIFEST_FILE",
    "ChecksumError",
    "WeightLoadError",
    "copy_shard",
    "load_weights",
    "load_weights_sharded",
    "save_sharded",
    "sha256_file",
    "verify_manifest",
]

INDEX_FILE = "model.safetensors.index.json"
SINGLE_FILE = "model.safetensors"
MANIFEST_FILE = "checksums.sha256.json"
# Published KDA checkpoints may store A_log as [H] instead of [1, 1, H, 1]; same values.
_RESHAPE_OK = ("A_log",)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file, streamed."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def save_sharded(
    state: dict[str, torch.Tensor],
    folder: str | Path,
    *,
    max_shard_bytes: int = 2 << 30,
    manifest: bool = True,
) -> list[str]:
    """Write `state` as sharded safetensors + index (+ manifest). Returns the shard file names."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    stored: set[tuple[int, int]] = set()
    for name, t in state.items():
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        if key in stored:  # tied weights are stored once; the loader re-ties them
            continue
        stored.add(key)
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t.detach().contiguous().cpu()
        size += nbytes
    files = [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    weight_map: dict[str, str] = {}
    for fname, shard in zip(files, shards, strict=True):
        save_file(shard, str(out / fname), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(shard, fname))
    total = sum(t.numel() * t.element_size() for t in state.values())
    (out / INDEX_FILE).write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    if manifest:
        digests = {f: sha256_file(out / f) for f in [*files, INDEX_FILE]}
        (out / MANIFEST_FILE).write_text(json.dumps({"algorithm": "sha256", "files": digests}, indent=1))
    return files


def verify_manifest(folder: str | Path) -> bool:
    """Check every file of the manifest; returns False when the folder has no manifest."""
    root = Path(folder)
    path = root / MANIFEST_FILE
    if not path.exists():
        return False
    try:
        data = json.loads(path.read_text())
        algorithm, files = data["algorithm"], data["files"]
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise ChecksumError(MANIFEST_FILE, f"unreadable manifest ({exc})") from exc
    if algorithm != "sha256":
        raise ChecksumError(MANIFEST_FILE, f"unsupported algorithm {algorithm!r}")
    for name, want in files.items():
        f = root / name
        if not f.is_file():
            raise ChecksumError(name, "listed in the manifest but missing")
        got = sha256_file(f)
        if got != want:
            raise ChecksumError(name, f"SHA-256 mismatch (expected {want[:16]}..., got {got[:16]}...)")
    return True


def _shard_map(root: Path) -> dict[str, list[str]]:
    """file -> tensor names, from the index file or the single-file checkpoint."""
    if (root / INDEX_FILE).exists():
        weight_map = json.loads((root / INDEX_FILE).read_text())["weight_map"]
        files: dict[str, list[str]] = {}
        for name, f in weight_map.items():
            files.setdefault(f, []).append(name)
        return files
    if (root / SINGLE_FILE).exists():
        with safe_open(str(root / SINGLE_FILE), framework="pt") as f:
            return {SINGLE_FILE: list(f.keys())}
    raise WeightLoadError(f"no {INDEX_FILE} or {SINGLE_FILE} in {root}")


def _progress(items: Iterable, total: int, enabled: bool) -> Iterable:
    if not enabled:
        yield from items
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task("loading weights", total=total)
        for item in items:
            yield item
            bar.advance(task)


@torch.no_grad()
def load_weights(
    model: nn.Module,
    folder: str | Path,
    *,
    verify: bool = True,
    progress: bool = False,
    ignore_unexpected: tuple[str, ...] = ("rotary_emb.inv_freq",),
    ignore_prefixes: tuple[str, ...] = (),
    quantization: QuantSpec | None = None,
) -> None:
    """Fill `model`'s parameters and buffers from the checkpoint in `folder` (strict).

    Tensors whose names end with `ignore_unexpected` or start with `ignore_prefixes` (layers the
    checkpoint ships but the model does not build, e.g. DeepSeek's MTP layers) are skipped.
    `quantization` (the config's `quantization_config`): FP8 / INT4 weights are dequantized to the
    parameter's dtype (`inference.quantized_weights`).

    Raises `ChecksumError` (before reading any tensor) when the manifest disagrees, and
    `WeightLoadError` for missing, unexpected or mis-shaped tensors.
    """
    root = Path(folder)
    if verify:
        verify_manifest(root)
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    tied = {n for n, p in model.named_parameters(remove_duplicate=False) if n not in targets}
    seen: set[str] = set()
    shards = _shard_map(root)
    # --- quantized-checkpoint hook: per shard, the weights it fills, read dequantized ---

    quantized = QuantizedCheckpoint(quantization, root, shards, next(model.parameters()).device)
    for fname, names in _progress(shards.items(), len(shards), progress):
        with safe_open(str(root / fname), framework="pt") as shard:
            f, names = quantized.view(shard, fname, names)
            for name in names:
                if name not in targets:
                    if name in tied or name.endswith(ignore_unexpected) or name.startswith(ignore_prefixes):
                        continue
                    raise WeightLoadError(f"unexpected tensor '{name}' in {fname}")
                src, dst = f.get_tensor(name), targets[name]
                if src.shape != dst.shape:
                    if name.endswith(_RESHAPE_OK) and src.numel() == dst.numel():
                        src = src.reshape(dst.shape)
                    else:
                        raise WeightLoadError(
                            f"tensor '{name}' in {fname}: shape {tuple(src.shape)} != {tuple(dst.shape)}"
                        )
                dst.copy_(src.to(dst.dtype))
                seen.add(name)
    _check_complete(targets, seen)


# -- sharded loading (tensor / expert parallel ranks) ------------------------------------------
# Kept apart from `load_weights`: a rank reads only its slice of each split tensor, straight from
# the file (`safe_open(...).get_slice`), and skips the tensors other ranks hold.


def copy_shard(dst: torch.Tensor, src: torch.Tensor, dim: int, what: str) -> None:
    """Copy the checkpoint slice `src` into `dst`; rows of `dst` past it along `dim` (vocab padding
    of the last rank) are zeroed."""
    n = src.shape[dim]
    if (
        dst.dim() != src.dim()
        or n > dst.shape[dim]
        or any(a != b for i, (a, b) in enumerate(zip(src.shape, dst.shape, strict=True)) if i != dim)
    ):
        raise WeightLoadError(f"{what}: slice shape {tuple(src.shape)} does not fit {tuple(dst.shape)}")
    dst.narrow(dim, 0, n).copy_(src.to(dst.dtype))
    if n < dst.shape[dim]:
        dst.narrow(dim, n, dst.shape[dim] - n).zero_()


@torch.no_grad()
def load_weights_sharded(
    model: nn.Module,
    folder: str | Path,
    slices: dict[str, tuple[int, int, int]],
    elsewhere: set[str],
    *,
    progress: bool = False,
    ignore_unexpected: tuple[str, ...] = ("rotary_emb.inv_freq",),
    ignore_prefixes: tuple[str, ...] = (),
    prefix: str = "",
) -> None:
    """Fill one rank's shard of a model (strict, as `load_weights`).

    `slices[name] = (dim, start, stop)`: the parameter holds that slice of the checkpoint tensor;
    `elsewhere`: checkpoint names another rank holds (skipped). `prefix`: the model is the
    checkpoint's submodule of that name (`language_model.` of a vision-language checkpoint), so a
    checkpoint name loses it first; the names `slices` and `elsewhere` use are the model's. The
    SHA-256 manifest is not read here: the driver verifies it once before the ranks start
    (`verify_manifest`).
    """
    root = Path(folder)
    targets = dict(model.named_parameters())
    targets.update(dict(model.named_buffers()))
    tied = {n for n, p in model.named_parameters(remove_duplicate=False) if n not in targets}
    seen: set[str] = set()
    shards = _shard_map(root)
    for fname, names in _progress(shards.items(), len(shards), progress):
        with safe_open(str(root / fname), framework="pt") as f:
            for ckpt_name in names:
                name = ckpt_name[len(prefix) :] if prefix and ckpt_name.startswith(prefix) else ckpt_name
                if name in elsewhere:
                    continue
                if name not in targets:
                    if (
                        name in tied
                        or name.endswith(ignore_unexpected)
                        or ckpt_name.startswith(ignore_prefixes)
                    ):
                        continue
                    raise WeightLoadError(f"unexpected tensor '{ckpt_name}' in {fname}")
                dst = targets[name]
                what = f"tensor '{ckpt_name}' in {fname}"
                if name in slices:
                    dim, start, stop = slices[name]
                    piece = f.get_slice(ckpt_name)
                    shape = piece.get_shape()
                    if len(shape) == dst.dim():
                        index = tuple(
                            slice(start, stop) if i == dim else slice(None) for i in range(len(shape))
                        )
                        copy_shard(dst, piece[index], dim, what)
                    elif name.endswith(_RESHAPE_OK):  # [H] stored for [1, 1, H, 1]: tiny, read whole
                        full = f.get_tensor(ckpt_name).reshape(-1)
                        view = [1] * dst.dim()
                        view[dim] = full.numel()
                        copy_shard(dst, full.view(view).narrow(dim, start, stop - start), dim, what)
                    else:
                        raise WeightLoadError(f"{what}: shape {tuple(shape)} cannot be split along dim {dim}")
                else:
                    src = f.get_tensor(ckpt_name)
                    if src.shape != dst.shape:
                        if name.endswith(_RESHAPE_OK) and src.numel() == dst.numel():
                            src = src.reshape(dst.shape)
                        else:
                            raise WeightLoadError(f"{what}: shape {tuple(src.shape)} != {tuple(dst.shape)}")
                    dst.copy_(src.to(dst.dtype))
                seen.add(name)
    _check_complete(targets, seen)


def _check_complete(targets, seen: set[str]) -> None:
    """Every tensor the model (or its shard) needs came from the checkpoint."""
    missing = sorted(set(targets) - seen)
    if missing:
        shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise WeightLoadError(f"{len(missing)} tensors missing from the checkpoint: {shown}")

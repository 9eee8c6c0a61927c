"""NaViT-style resize to the patch grid, pad, normalise, patchify.

Same rules as `transformers`' `Kimi_K25ImageProcessor` (its `navit_resize` and torchvision
backend), written for one image on one core:

* target size: never upscale; shrink so that (h // p) * (w // p) <= max_patches and each side
  <= max_size_per_side * p; truncate to int; then pad bottom/right with zeros to a multiple of
  p * merge;
* resize: antialiased bicubic (a = -0.5) on uint8, i.e. torch's native uint8 kernel, the one
  torchvision itself calls (bitwise the reference's pixels);
* normalise: ((v - mean*255) / (std*255)) in float32, done through a 256-entry lookup table
  on the uint8 pixels (identical values, one pass);
* layout: `pixel_values[N, 3, p, p]` with patches in row-major grid order, `grid_thw = [1, gh, gw]`.

Only uint8 pixels are rearranged (in runs of whole patch rows); the float32 output is written exactly
once.
"""

from __future__ import annotations

import math

import numpy as np

from preprocess.config import PreprocessConfig


def target_size(height: int, width: int, config: PreprocessConfig) -> tuple[tuple[int, int], tuple[int, int]]:
    """((resized_h, resized_w), (padded_h, padded_w)) for an image of `height` x `width`.

    The float arithmetic follows the reference step by step so that truncation lands on the same
    integer for every size.
    """
    p = config.patch_size
    patches_h = max(1.0, height // p)
    patches_w = max(1.0, width // p)
    scale_total = math.sqrt(config.max_patches / (patches_h * patches_w))
    side = config.max_size_per_side * p
    scale = min(1.0, scale_total, side / height, side / width)
    new_h = min(max(1, int(height * scale)), side)
    new_w = min(max(1, int(width * scale)), side)
    factor = config.merge_size * p
    pad_h = (factor - new_h % factor) % factor + new_h
    pad_w = (factor - new_w % factor) % factor + new_w
    return (new_h, new_w), (pad_h, pad_w)


def resize_rgb(rgb: np.ndarray, height: int, width: int) -> np.ndarray:
    """Antialiased bicubic resize of an HxWx3 uint8 array (returns the input when the size is unchanged)."""
    if rgb.shape[:2] == (height, width):
        return rgb
    import torch  # lazy: importing `preprocess` must stay cheap for the CLI and the API

    if not (rgb.flags.writeable and rgb.flags.c_contiguous):
        rgb = np.array(rgb)  # torch wants a writable buffer (decode_array's output already is one)
    # Batch dim first, then permute: the strides then read as channels_last for the whole 4-d
    # tensor, so the output is channels_last too and `out[0].permute(1, 2, 0)` is the HxWx3 array
    # itself (permuting first gives a batch stride of 3: an NCHW output and a strided copy back,
    # about half the resize time).
    src = torch.from_numpy(rgb).unsqueeze(0).permute(0, 3, 1, 2)
    out = torch.nn.functional.interpolate(
        src, size=[height, width], mode="bicubic", align_corners=False, antialias=True
    )
    if out.dtype != torch.uint8:  # only CPUs without the native uint8 kernel
        out = out.clamp_(0, 255).round_().to(torch.uint8)
    return out[0].permute(1, 2, 0).contiguous().numpy()


def normalization_luts(config: PreprocessConfig) -> np.ndarray:
    """float32[3, 256]: the normalised value of every uint8 level, per channel, computed exactly as the
    reference's fused rescale+normalise: (float32(v) - mean*255) / (std*255)."""
    levels = np.arange(256, dtype=np.float32)
    scale = np.float32(1.0 / (1.0 / 255.0))  # the reference divides by rescale_factor = 1/255
    mean = np.asarray(config.image_mean, dtype=np.float32) * scale
    std = np.asarray(config.image_std, dtype=np.float32) * scale
    return ((levels[None, :] - mean[:, None]) / std[:, None]).astype(np.float32)


def _planar_patches(rgb: np.ndarray, pad_h: int, pad_w: int, p: int) -> np.ndarray:
    """uint8 (gh*gw, 3, p*p): the image zero-padded to pad_h x pad_w and cut into channel-planar
    patches, row-major over the grid.

    Every move is a long contiguous run: a patch row of p interleaved pixels is one `V{3p}` item, so
    gathering patches is a copy of 3p-byte items (numpy's strided byte gathers, 3 bytes apart, cost
    twice the whole normalisation); OpenCV's SIMD `split` then deinterleaves each patch's pixels
    straight into the channel planes of the output. Only the partial last row and column of patches
    go through small zero-padded strips (no full padded copy of the image).
    """
    import cv2  # lazy, see resize_rgb

    rgb = np.ascontiguousarray(rgb)
    h, w, _ = rgb.shape
    gh, gw = pad_h // p, pad_w // p
    fh, fw = h // p, w // p  # whole patches
    item = np.dtype(f"V{3 * p}")  # one patch row: p interleaved pixels
    grid = np.empty((gh, gw, p, 3 * p), dtype=np.uint8)
    items = grid.view(item).reshape(gh, gw, p)
    if fh and fw:  # straight from the image, read in place as items
        whole = np.ndarray((fh, p, fw), dtype=item, buffer=rgb, strides=(p * 3 * w, 3 * w, 3 * p))
        items[:fh, :fw] = whole.transpose(0, 2, 1)
    if fh < gh:  # bottom strip, full width (includes the corner), through a small zero-padded copy
        strip = np.zeros(((gh - fh) * p, gw * p, 3), dtype=np.uint8)
        strip[: h - fh * p, :w] = rgb[fh * p :]
        items[fh:] = strip.reshape(-1, gw * p * 3).view(item).reshape(gh - fh, p, gw).transpose(0, 2, 1)
    if fw < gw and fh:  # right strip, rows of whole patches only
        strip = np.zeros((fh * p, (gw - fw) * p, 3), dtype=np.uint8)
        strip[:, : w - fw * p] = rgb[: fh * p, fw * p :]
        items[:fh, fw:] = strip.reshape(fh * p, -1).view(item).reshape(fh, p, gw - fw).transpose(0, 2, 1)
    n = gh * gw
    planar = np.empty((n, 3, p * p), dtype=np.uint8)
    cv2.split(grid.view(np.uint8).reshape(n, p * p, 3), [planar[:, 0], planar[:, 1], planar[:, 2]])
    return planar


def patchify_u8(rgb: np.ndarray, pad_h: int, pad_w: int, config: PreprocessConfig) -> np.ndarray:
    """HxWx3 uint8 -> uint8[gh*gw, 3, p*p] channel-planar patches, zero-padded to pad_h x pad_w
    (the pixels before normalisation: a quarter of the float32 result's bytes, which is why the
    blob store keeps these)."""
    h, w, _ = rgb.shape
    p = config.patch_size
    if h > pad_h or w > pad_w or pad_h % p or pad_w % p:
        raise ValueError(f"cannot pad {h}x{w} to {pad_h}x{pad_w} in {p}-pixel patches")
    return _planar_patches(rgb, pad_h, pad_w, p)


def normalize_patches(planar: np.ndarray, config: PreprocessConfig) -> np.ndarray:
    """uint8[N, 3, p*p] -> float32[N, 3, p, p] through the per-channel lookup tables."""
    import cv2  # lazy, see resize_rgb

    n = planar.shape[0]
    p = config.patch_size
    luts = normalization_luts(config)
    # numpy allocates the output (huge-page advised), which halves page-fault time vs OpenCV's own.
    out = np.empty((n, 3, p * p), dtype=np.float32)
    if np.array_equal(luts[0], luts[1]) and np.array_equal(luts[0], luts[2]):
        cv2.LUT(planar.reshape(n, 3 * p * p), luts[0].reshape(256, 1), dst=out.reshape(n, 3 * p * p))
    else:
        for c in range(3):
            out[:, c] = cv2.LUT(np.ascontiguousarray(planar[:, c]), luts[c].reshape(256, 1))
    return out.reshape(n, 3, p, p)


def patchify(rgb: np.ndarray, pad_h: int, pad_w: int, config: PreprocessConfig) -> np.ndarray:
    """HxWx3 uint8 -> float32[gh*gw, 3, p, p], zero-padded (before normalisation) to pad_h x pad_w."""
    return normalize_patches(patchify_u8(rgb, pad_h, pad_w, config), config)

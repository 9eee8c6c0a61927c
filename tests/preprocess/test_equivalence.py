"""Equivalence with transformers' Kimi_K25ImageProcessor on generated images of odd sizes and modes.

The reference gets what a user would hand it: `PIL.Image.open(bytes)`. Shapes and grids must be
identical and pixel values within 1/255 before normalisation (in practice they are bitwise equal).
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from preprocess import PreprocessConfig, decode_image, process_image
from tests.preprocess.images import encode, smooth_rgb

# (width, height): tiny, prime, thin, exact multiples of 28, and sizes over the 16384-patch budget.
SIZES = [
    (1, 1),
    (13, 7),
    (14, 14),
    (28, 28),
    (29, 31),
    (97, 61),
    (333, 777),
    (640, 480),
    (1000, 29),
    (1023, 1),
    (1920, 1080),
    (1900, 1700),
    (2051, 1603),
]

# (mode, format, save params): every mode a PNG/JPEG/GIF/BMP/TIFF/WebP commonly decodes to.
MODES = [
    ("RGB", "PNG", {}),
    ("RGB", "JPEG", {"quality": 85}),
    ("RGB", "WEBP", {"lossless": True}),
    ("RGB", "BMP", {}),
    ("RGB", "TIFF", {}),
    ("L", "PNG", {}),
    ("L", "JPEG", {}),
    ("1", "PNG", {}),
    ("P", "PNG", {}),
    ("P", "GIF", {}),
    ("CMYK", "JPEG", {}),
    ("CMYK", "TIFF", {}),
    ("RGBA", "PNG", {}),  # fully opaque alpha: compositing on white changes nothing
    ("LA", "PNG", {}),
]


def _make(width: int, height: int, mode: str, fmt: str, params: dict, seed: int) -> bytes:
    img = Image.fromarray(smooth_rgb(width, height, seed))
    if mode == "P":
        img = img.quantize(colors=200)
    elif mode != "RGB":
        img = img.convert(mode)
    return encode(img, fmt, **params)


CASES = []
for i, (w, h) in enumerate(SIZES):
    for j, (mode, fmt, params) in enumerate(MODES):
        # Every size in RGB/PNG; the other modes on a rotating subset of sizes (keeps the run short).
        if j == 0 or (i + j) % 5 == 0:
            CASES.append(pytest.param(w, h, mode, fmt, params, id=f"{w}x{h}-{mode}-{fmt}"))


@pytest.fixture(scope="module")
def reference():
    import torch
    from transformers import Kimi_K25ImageProcessor

    torch.set_num_threads(1)
    return Kimi_K25ImageProcessor()


def assert_equivalent(ours, ref_out, config: PreprocessConfig) -> None:
    ref_pv = ref_out["pixel_values"]
    ref_pv = ref_pv.numpy() if hasattr(ref_pv, "numpy") else np.asarray(ref_pv)
    ref_grid = np.asarray(ref_out["image_grid_thw"])
    assert ours.pixel_values.dtype == np.float32
    assert ours.pixel_values.shape == ref_pv.shape
    assert np.array_equal(ours.grid_thw, ref_grid)
    std = np.asarray(config.image_std, dtype=np.float32).reshape(1, 3, 1, 1)
    diff_levels = np.abs(ours.pixel_values - ref_pv) * std * 255.0  # in uint8 levels, before normalisation
    assert float(diff_levels.max()) <= 1.0 + 1e-4


def test_case_count():
    assert len(CASES) >= 36


@pytest.mark.parametrize(("width", "height", "mode", "fmt", "params"), CASES)
def test_matches_reference(reference, width, height, mode, fmt, params):
    data = _make(width, height, mode, fmt, params, seed=width * 7 + height)
    config = PreprocessConfig()
    ours = process_image(data, config)
    ref = reference(images=Image.open(io.BytesIO(data)), return_tensors="pt")
    assert_equivalent(ours, ref, config)
    assert ours.grid_thw[0, 1] * ours.grid_thw[0, 2] == ours.num_patches


@pytest.mark.parametrize(
    "config",
    [
        PreprocessConfig(max_patches=1024),
        PreprocessConfig(max_patches=4096, max_size_per_side=40),
        PreprocessConfig(
            image_mean=(0.48145466, 0.4578275, 0.40821073), image_std=(0.26862954, 0.26130258, 0.27577711)
        ),
    ],
    ids=["max_patches_1024", "side_limit_40", "clip_mean_std"],
)
def test_matches_reference_with_other_settings(reference, config):
    data = encode(Image.fromarray(smooth_rgb(1531, 977, seed=3)), "PNG")
    ref = reference(
        images=Image.open(io.BytesIO(data)),
        max_patches=config.max_patches,
        size={"max_height": config.max_size_per_side, "max_width": config.max_size_per_side},
        image_mean=list(config.image_mean),
        image_std=list(config.image_std),
        return_tensors="pt",
    )
    assert_equivalent(process_image(data, config), ref, config)


def test_transparent_pixels_composited_on_white(reference):
    """Deliberate difference: the reference's convert('RGB') drops alpha (hidden colour shows);
    we composite on white. Past decode the pipelines agree."""
    rgba = np.zeros((60, 90, 4), dtype=np.uint8)
    rgba[..., 0] = 200  # hidden red under transparent pixels
    rgba[:, 45:, 3] = 255
    data = encode(Image.fromarray(rgba, "RGBA"), "PNG")
    decoded = np.asarray(decode_image(data))
    assert (decoded[:, :45] == 255).all()
    assert (decoded[:, 45:] == [200, 0, 0]).all()
    config = PreprocessConfig()
    ref = reference(images=decode_image(data), return_tensors="pt")
    assert_equivalent(process_image(data, config), ref, config)

"""Stored processed results: uint8 patches + normalisation (a quarter of the float bytes), loading
to exactly the floats the pipeline produced; results stored as floats still load."""

from __future__ import annotations

import dataclasses

import numpy as np
from PIL import Image

from preprocess import PreprocessConfig, ProcessedImage, process_image
from tests.preprocess.images import encode, smooth_rgb


def test_uint8_blob_loads_to_the_same_floats():
    config = PreprocessConfig(image_mean=(0.48, 0.46, 0.41), image_std=(0.27, 0.26, 0.28))
    img = process_image(encode(Image.fromarray(smooth_rgb(300, 200, seed=2)), "PNG"), config)
    blob = img.to_bytes()
    assert blob.startswith(b"DZPP2\n") and len(blob) < img.pixel_values.nbytes / 3.5
    back = ProcessedImage.from_bytes(blob)
    assert back.pixel_values.dtype == np.float32 and np.array_equal(back.pixel_values, img.pixel_values)
    assert back.content_hash == img.content_hash and back.grid_list() == img.grid_list()
    assert back.to_bytes() == blob  # deterministic


def test_float_blobs_still_load():
    img = process_image(encode(Image.fromarray(smooth_rgb(60, 40)), "PNG"))
    floats = dataclasses.replace(img, patches_u8=None, normalization=None).to_bytes()
    assert floats.startswith(b"DZPP1\n")
    assert np.array_equal(ProcessedImage.from_bytes(floats).pixel_values, img.pixel_values)

"""The fast paths of `decode_array` (OpenCV; ISA-L inflate for plain PNGs) give exactly Pillow's
pixels, and only take the files they are safe for; everything else goes through Pillow (which owns
error reporting)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from preprocess import TruncatedImageError, decode_image
from preprocess import decode as decode_mod
from preprocess.decode import decode_array
from tests.preprocess.images import encode, smooth_rgb

RGB = Image.fromarray(smooth_rgb(333, 217, seed=8))


def _png16_rgb() -> bytes:
    """A 16-bit-per-sample RGB PNG (Pillow cannot write one), built chunk by chunk."""
    h, w = 20, 30
    px = (np.arange(h * w * 3, dtype=np.uint32).reshape(h, w, 3) * 37 % 65536).astype(">u2")
    raw = b"".join(b"\x00" + px[y].tobytes() for y in range(h))

    def chunk(kind: bytes, payload: bytes) -> bytes:
        return (
            struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))
        )

    ihdr = struct.pack(">IIBBBBB", w, h, 16, 2, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")
    )


def _with_orientation(img: Image.Image, value: int) -> bytes:
    exif = Image.Exif()
    exif[0x0112] = value
    return encode(img, "JPEG", exif=exif.tobytes())


CASES = {
    # name: (bytes, takes a fast path)
    "jpeg-420": (encode(RGB, "JPEG", quality=90), True),
    "jpeg-444": (encode(RGB, "JPEG", quality=90, subsampling=0), True),
    "jpeg-422": (encode(RGB, "JPEG", quality=90, subsampling=1), True),
    "jpeg-progressive": (encode(RGB, "JPEG", quality=80, progressive=True), True),
    "jpeg-optimized": (encode(RGB, "JPEG", quality=75, optimize=True), True),
    "jpeg-grey": (encode(RGB.convert("L"), "JPEG"), True),
    "jpeg-exif-orientation-1": (_with_orientation(RGB, 1), True),
    "jpeg-exif-rotated": (_with_orientation(RGB, 8), False),
    "jpeg-trailing-garbage": (encode(RGB, "JPEG") + b"garbage after EOI", False),
    "jpeg-cmyk": (encode(RGB.convert("CMYK"), "JPEG"), False),
    "png-rgb": (encode(RGB, "PNG"), True),
    "png-grey": (encode(RGB.convert("L"), "PNG"), True),
    "png-optimized": (encode(RGB, "PNG", optimize=True), True),
    "png-palette": (encode(RGB.quantize(64), "PNG"), False),
    "png-rgba": (encode(RGB.convert("RGBA"), "PNG"), False),
    "png-16bit-rgb": (_png16_rgb(), False),
    "webp": (encode(RGB, "WEBP", lossless=True), False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_matches_pillow(name, monkeypatch):
    data, fast = CASES[name]
    calls = []  # pixels returned by a fast decoder (OpenCV, or the ISA-L path for plain PNGs)

    def spying(real):
        def spy(*args):
            out = real(*args)
            if out is not None:
                calls.append(1)
            return out

        return spy

    monkeypatch.setattr(decode_mod, "_cv2_decode", spying(decode_mod._cv2_decode))
    monkeypatch.setattr(decode_mod, "decode_plain_png", spying(decode_mod.decode_plain_png))
    ours = decode_array(data)
    assert ours.flags.writeable and ours.flags.c_contiguous and ours.dtype == np.uint8
    assert np.array_equal(ours, np.asarray(decode_image(data)))
    assert bool(calls) == fast


def test_16bit_rgb_png_reduced_by_pillow():
    data = _png16_rgb()
    with Image.open(io.BytesIO(data)) as raw:
        assert raw.mode == "RGB"
    assert decode_array(data).shape == (20, 30, 3)


def test_truncated_jpeg_never_takes_the_fast_path():
    data = encode(RGB, "JPEG")
    with pytest.raises(TruncatedImageError):
        decode_array(data[: len(data) * 2 // 3])
    # Cut, then "repaired" with a fake end marker: OpenCV would grey-fill silently; whatever
    # path is taken, the result must be what Pillow decodes (or Pillow's error).
    forged = data[: len(data) * 2 // 3] + b"\xff\xd9"
    try:
        expected = np.asarray(decode_image(forged))
    except TruncatedImageError:
        with pytest.raises(TruncatedImageError):
            decode_array(forged)
    else:
        assert np.abs(decode_array(forged).astype(int) - expected).max() <= 1

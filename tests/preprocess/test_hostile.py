"""The hostile corpus: each input gets its documented outcome, fast and without a big allocation.

| input                                  | outcome                                                    |
| -------------------------------------- | ---------------------------------------------------------- |
| PNG/GIF/BMP/JPEG bomb (huge header)    | ImageTooLargeError before any pixel is decoded             |
| over max_bytes                         | ImageTooLargeError (reason "bytes")                        |
| truncated JPEG / PNG (and cut headers) | TruncatedImageError                                        |
| 1x100000 / 100000x1 strip              | accepted: 1x7168 after resize, grid [1, 2, 512], = reference |
| CMYK JPEG                              | accepted, Pillow's CMYK->RGB (as the reference)            |
| 16-bit grey PNG                        | accepted, scaled v*255/65535 (the reference saturates: deviation) |
| animated GIF                           | accepted, first frame only                                 |
| EXIF-rotated JPEG                      | accepted, orientation applied (the reference ignores EXIF) |
| non-image bytes named .jpg/.png        | NotAnImageError                                            |
| PDF, SVG, HEIC, PSD, ICO               | UnsupportedFormatError                                     |
| format outside the config allow-list   | UnsupportedFormatError                                     |
| empty bytes, 0-width PNG, 0x0 GIF      | ZeroSizeImageError                                         |
"""

from __future__ import annotations

import io
import json
import resource
import struct
import time
import zlib

import numpy as np
import pytest
from PIL import Image

from preprocess import (
    ImageError,
    ImageTooLargeError,
    NotAnImageError,
    PreprocessConfig,
    TruncatedImageError,
    UnsupportedFormatError,
    ZeroSizeImageError,
    decode_image,
    error_from_dict,
    process_image,
)
from tests.preprocess.images import encode, smooth_rgb


def _chunk(kind: bytes, payload: bytes) -> bytes:
    return struct.pack(">I", len(payload)) + kind + payload + struct.pack(">I", zlib.crc32(kind + payload))


def png_bomb(width: int, height: int) -> bytes:
    """A valid-looking PNG header declaring width x height, with a tiny (lying) IDAT."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    idat = zlib.compress(b"\x00" * 1024)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def png_real_bomb() -> bytes:
    """A genuine zlib bomb: 20000x20000 black RGB (1.2 GB of pixels) in about 1.2 MB."""
    row = b"\x00" + b"\x00" * (20000 * 3)
    comp = zlib.compressobj(9)
    body = b"".join(comp.compress(row) for _ in range(20000)) + comp.flush()
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", body) + _chunk(b"IEND", b"")


def gif_header(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b";"


def jpeg_bomb() -> bytes:
    """Baseline JPEG whose SOF0 claims 65500x65500."""
    data = bytearray(encode(Image.fromarray(smooth_rgb(64, 48)), "JPEG"))
    sof = data.find(b"\xff\xc0")
    data[sof + 5 : sof + 9] = struct.pack(">HH", 65500, 65500)
    return bytes(data)


@pytest.fixture(scope="module")
def rgb_jpeg() -> bytes:
    return encode(Image.fromarray(smooth_rgb(300, 200, seed=1)), "JPEG", quality=90)


@pytest.fixture(scope="module")
def rgb_png() -> bytes:
    return encode(Image.fromarray(smooth_rgb(300, 200, seed=2)), "PNG")


def _raises(data: bytes, cls: type[ImageError], config: PreprocessConfig | None = None) -> ImageError:
    with pytest.raises(cls) as info:
        decode_image(data, config)
    err = info.value
    # Every error is JSON, names what to do, and survives Celery's (type, args) reconstruction.
    desc = json.loads(json.dumps(err.to_dict()))
    assert desc["type"] == cls.__name__ and desc["retryable"] is False and len(desc["message"]) > 20
    rebuilt = type(err)(*err.args)
    assert str(rebuilt) == str(err) and rebuilt.details == err.details
    assert type(error_from_dict(desc)) is cls
    return err


@pytest.mark.parametrize(
    "make",
    [lambda: png_bomb(100_000, 100_000), lambda: gif_header(65535, 65535), jpeg_bomb, png_real_bomb],
    ids=["png-header", "gif-screen", "jpeg-sof", "png-zlib-bomb"],
)
def test_bombs_refused_before_decoding(make):
    data = make()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    started = time.perf_counter()
    err = _raises(data, ImageTooLargeError)
    assert time.perf_counter() - started < 2.0
    assert err.details["reason"] == "pixels"
    # Not even one decoded row of the bomb was kept around (ru_maxrss is in KiB).
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss_before < 200_000


def test_pixel_and_byte_limits_are_configurable(rgb_png):
    assert (
        _raises(rgb_png, ImageTooLargeError, PreprocessConfig(max_pixels=300 * 200 - 1)).details["reason"]
        == "pixels"
    )
    assert (
        _raises(rgb_png, ImageTooLargeError, PreprocessConfig(max_bytes=len(rgb_png) - 1)).details["reason"]
        == "bytes"
    )
    decode_image(rgb_png, PreprocessConfig(max_pixels=300 * 200, max_bytes=len(rgb_png)))


@pytest.mark.parametrize("fraction", [0.5, 0.9])
def test_truncated_jpeg(rgb_jpeg, fraction):
    _raises(rgb_jpeg[: int(len(rgb_jpeg) * fraction)], TruncatedImageError)


@pytest.mark.parametrize("fraction", [0.3, 0.7])
def test_truncated_png(rgb_png, fraction):
    _raises(rgb_png[: int(len(rgb_png) * fraction)], TruncatedImageError)


@pytest.mark.parametrize("cut", [4, 20, 60], ids=lambda c: f"first-{c}-bytes")
def test_cut_headers(rgb_jpeg, rgb_png, cut):
    _raises(rgb_jpeg[:cut], TruncatedImageError)
    _raises(rgb_png[:cut] if cut > 8 else rgb_png[:9], TruncatedImageError)


def test_corrupt_png_crc(rgb_png):
    data = bytearray(rgb_png)
    idat = data.find(b"IDAT")
    data[idat + 20] ^= 0xFF
    _raises(bytes(data), TruncatedImageError)


@pytest.mark.parametrize("size", [(100_000, 1), (1, 100_000)], ids=["1x100000", "100000x1"])
def test_extreme_strip_is_processed_like_the_reference(size):
    import torch
    from transformers import Kimi_K25ImageProcessor

    torch.set_num_threads(1)
    width, height = size
    data = encode(Image.fromarray(smooth_rgb(width, height, seed=5)), "PNG")
    ours = process_image(data)
    # scale = 7168 / 100000; int(100000 * scale) truncates to 7167 (as the reference), padded to 7168.
    expected_grid = [1, 2, 512] if height == 1 else [1, 512, 2]
    assert ours.grid_list() == [expected_grid]
    assert ours.resized_size == ((1, 7167) if height == 1 else (7167, 1))
    ref = Kimi_K25ImageProcessor()(images=Image.open(io.BytesIO(data)), return_tensors="pt")
    assert ours.pixel_values.shape == tuple(ref["pixel_values"].shape)
    assert np.abs(ours.pixel_values - ref["pixel_values"].numpy()).max() * 127.5 <= 1.0 + 1e-4


def test_cmyk_jpeg_converted_to_rgb():
    cmyk = np.zeros((40, 60, 4), dtype=np.uint8)
    cmyk[:, :30] = (0, 255, 255, 0)  # red
    cmyk[:, 30:] = (255, 255, 0, 0)  # blue
    data = encode(Image.fromarray(cmyk, "CMYK"), "JPEG", quality=95)
    with Image.open(io.BytesIO(data)) as raw:
        assert raw.mode == "CMYK"
        expected = np.asarray(raw.convert("RGB"))
    rgb = np.asarray(decode_image(data))
    assert np.array_equal(rgb, expected)  # the reference's own conversion
    assert (rgb[20, 10].astype(int) - [255, 0, 0]).__abs__().max() < 12
    assert (rgb[20, 50].astype(int) - [0, 0, 255]).__abs__().max() < 12


def test_16_bit_grey_png_scaled_not_saturated():
    wide = (np.arange(64 * 32, dtype=np.uint32).reshape(32, 64) * 16).astype(np.uint16)  # up to 32752
    data = encode(Image.fromarray(wide), "PNG")
    with Image.open(io.BytesIO(data)) as raw:
        assert raw.mode.startswith("I;16")
        saturated = np.asarray(raw.convert("RGB"))  # what the reference would see
    assert (saturated[..., 0] == 255).mean() > 0.9
    rgb = np.asarray(decode_image(data)).astype(np.int64)
    expected = (wide.astype(np.int64) * 255 + 32767) // 65535
    assert np.array_equal(rgb[..., 0], expected) and np.array_equal(rgb[..., 2], expected)
    assert rgb.max() == 127


def test_animated_gif_uses_first_frame():
    frames = [Image.new("RGB", (48, 32), color) for color in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    buf = io.BytesIO()
    frames[0].save(buf, "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)
    with Image.open(io.BytesIO(buf.getvalue())) as raw:
        assert raw.n_frames == 3
    rgb = np.asarray(decode_image(buf.getvalue()))
    assert rgb.shape == (32, 48, 3) and (rgb == [255, 0, 0]).all()
    assert process_image(buf.getvalue()).content_hash == process_image(encode(frames[0], "PNG")).content_hash


@pytest.mark.parametrize("fmt", ["PNG", "TIFF", "WEBP"], ids=["apng", "multipage-tiff", "animated-webp"])
def test_other_multi_frame_files_use_first_frame(fmt):
    frames = [Image.new("RGB", (30, 20), color) for color in ((0, 0, 255), (255, 255, 0))]
    buf = io.BytesIO()
    params = {"lossless": True} if fmt == "WEBP" else {}
    frames[0].save(buf, fmt, save_all=True, append_images=frames[1:], **params)
    rgb = np.asarray(decode_image(buf.getvalue()))
    assert rgb.shape == (20, 30, 3) and (rgb == [0, 0, 255]).all()


def test_exif_orientation_applied():
    arr = np.zeros((32, 64, 3), dtype=np.uint8)
    arr[:8, :8] = 255  # white mark top-left of the stored pixels
    exif = Image.Exif()
    exif[0x0112] = 6  # "rotate 90 CW to display"
    data = encode(Image.fromarray(arr), "JPEG", quality=95, exif=exif.tobytes())
    rgb = np.asarray(decode_image(data))
    assert rgb.shape == (64, 32, 3)  # displayed upright: width and height swapped
    assert rgb[:8, -8:].mean() > 200 and rgb[:8, :8].mean() < 50  # the mark moved to the top-right
    assert process_image(data).source_size == (64, 32)
    raw = np.asarray(decode_image(data, PreprocessConfig(apply_exif_orientation=False)))
    assert raw.shape == (32, 64, 3)


@pytest.mark.parametrize(
    "data",
    [
        b"hello, this is a text file named photo.jpg\n" * 10,
        b"<!doctype html><html><body>not found</body></html>",
        b"PK\x03\x04" + b"\x00" * 100,  # a zip
        b"\x7fELF\x02\x01\x01" + b"\x00" * 100,
        bytes(range(256)) * 4,
        b"RIFF\x10\x00\x00\x00WAVEfmt ",  # RIFF, but audio
    ],
    ids=["text", "html", "zip", "elf", "binary", "riff-wave"],
)
def test_non_image_bytes(data):
    _raises(data, NotAnImageError)


@pytest.mark.parametrize(
    "data",
    [
        b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n",
        b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg"></svg>',
        b"\x00\x00\x00\x18ftypheic\x00\x00\x00\x00mif1heic",
        b"8BPS\x00\x01" + b"\x00" * 40,
        b"\x00\x00\x01\x00\x01\x00" + b"\x00" * 40,
    ],
    ids=["pdf", "svg", "heic", "psd", "ico"],
)
def test_unsupported_image_formats(data):
    _raises(data, UnsupportedFormatError)


def test_format_outside_allow_list(rgb_jpeg):
    err = _raises(rgb_jpeg, UnsupportedFormatError, PreprocessConfig(allowed_formats=("PNG",)))
    assert err.details["format"] == "JPEG"


@pytest.mark.parametrize(
    "data",
    [b"", png_bomb(0, 10), png_bomb(10, 0), gif_header(0, 0)],
    ids=["empty", "png-width-0", "png-height-0", "gif-0x0"],
)
def test_zero_size(data):
    _raises(data, ZeroSizeImageError)


def test_palette_transparency_composited_on_white():
    img = Image.new("P", (20, 10), 0)
    img.putpalette([255, 0, 0, 0, 255, 0] + [0] * 762)
    img.paste(1, (10, 0, 20, 10))
    data = encode(img, "PNG", transparency=0)
    rgb = np.asarray(decode_image(data))
    assert (rgb[:, :10] == 255).all() and (rgb[:, 10:] == [0, 255, 0]).all()

"""The fast PNG path (`preprocess.png`, ISA-L inflate from the `isal` wheel): every filter type reconstructs to Pillow's pixels,
and every file outside its scope is handed back (None) so OpenCV/Pillow decide."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest
from PIL import Image

from preprocess import TruncatedImageError, decode_image, png
from preprocess.decode import decode_array
from tests.preprocess.images import smooth_rgb


def _paeth(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    a, b, c = (x.astype(np.int16) for x in (a, b, c))
    p = a + b - c
    pa, pb, pc = np.abs(p - a), np.abs(p - b), np.abs(p - c)
    return np.where((pa <= pb) & (pa <= pc), a, np.where(pb <= pc, b, c)).astype(np.uint8)


def _filter_row(kind: int, row: np.ndarray, above: np.ndarray, bpp: int) -> np.ndarray:
    """PNG's forward filter of one scanline (encoders do this; here it picks the filter we test)."""
    left = np.concatenate((np.zeros(bpp, np.uint8), row[:-bpp]))
    upper_left = np.concatenate((np.zeros(bpp, np.uint8), above[:-bpp]))
    predictor = {
        0: np.zeros_like(row),
        1: left,
        2: above,
        3: ((left.astype(np.uint16) + above) // 2).astype(np.uint8),
        4: _paeth(left, above, upper_left),
    }[kind]
    return row - predictor


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def make_png(pixels: np.ndarray, kinds: list[int], *, interlace: int = 0, stream=None, split=False) -> bytes:
    """An 8-bit grey (HxW) or RGB (HxWx3) PNG with the given filter type on each row."""
    h, w = pixels.shape[:2]
    bpp = 1 if pixels.ndim == 2 else 3
    flat = pixels.reshape(h, w * bpp)
    above = np.zeros(w * bpp, np.uint8)
    raw = b""
    for y in range(h):
        raw += bytes([kinds[y]]) + _filter_row(kinds[y], flat[y], above, bpp).tobytes()
        above = flat[y]
    z = zlib.compress(raw) if stream is None else stream(raw)
    ihdr = struct.pack(">IIBBBBB", w, h, 8, 0 if bpp == 1 else 2, 0, 0, interlace)
    idat = _chunk(b"IDAT", z[: len(z) // 2]) + _chunk(b"IDAT", z[len(z) // 2 :])
    if split:
        idat = (
            _chunk(b"IDAT", z[: len(z) // 2]) + _chunk(b"tEXt", b"k\x00v") + _chunk(b"IDAT", z[len(z) // 2 :])
        )
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + idat + _chunk(b"IEND", b"")


H, W = 61, 47
RGB = smooth_rgb(W, H, seed=5)
GREY = RGB[:, :, 1].copy()
ROWS = {
    "none": [0] * H,
    "sub": [1] * H,
    "up": [2] * H,
    "average": [3] * H,
    "paeth": [4] * H,
    "mixed": [(y * 7 + y // 3) % 5 for y in range(H)],  # many Average/Paeth chains: the whole-image way
    "few-paeth": [1 if y % 9 else 4 for y in range(H)],  # a handful of chains: row by row
    "up-first": [2, 2, 4, 1, 2, 2, 3, 0] + [2] * (H - 8),
}


def _pillow(data: bytes) -> np.ndarray:
    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


@pytest.mark.parametrize("colour", ["rgb", "grey"])
@pytest.mark.parametrize("rows", list(ROWS))
def test_every_filter_matches_pillow(rows, colour):
    data = make_png(RGB if colour == "rgb" else GREY, ROWS[rows])
    ours = png.decode_plain_png(data)
    assert ours is not None
    assert ours.dtype == np.uint8 and ours.flags.c_contiguous and ours.flags.writeable
    assert np.array_equal(ours, _pillow(data))
    assert np.array_equal(decode_array(data), ours)


def test_pillow_and_opencv_written_pngs_match():
    import cv2

    big = smooth_rgb(600, 400, seed=2)
    for data in (
        _encode_pil(big),
        _encode_pil(big[:, :, 0].copy()),
        cv2.imencode(".png", np.ascontiguousarray(big[:, :, ::-1]))[1].tobytes(),
    ):
        ours = png.decode_plain_png(data)
        assert ours is not None and np.array_equal(ours, _pillow(data))


def _encode_pil(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def _bad_adler(raw: bytes) -> bytes:
    z = zlib.compress(raw)
    return z[:-4] + bytes(b ^ 0xFF for b in z[-4:])


OUT_OF_SCOPE = {
    "interlaced": {"interlace": 1},
    "bad-adler32": {"stream": _bad_adler},
    "trailing-data-in-idat": {"stream": lambda raw: zlib.compress(raw) + b"\x00\x00"},
    "short-stream": {"stream": lambda raw: zlib.compress(raw[:-10])},
    "long-stream": {"stream": lambda raw: zlib.compress(raw + b"\x00" * 48)},
    "idat-split-by-a-chunk": {"split": True},
}


@pytest.mark.parametrize("name", list(OUT_OF_SCOPE))
def test_out_of_scope_is_handed_back(name):
    data = make_png(RGB, ROWS["mixed"], **OUT_OF_SCOPE[name])
    assert png.decode_plain_png(data) is None
    try:  # whoever decodes it then, the answer is Pillow's: its pixels or its error
        expected = np.asarray(decode_image(data))
    except TruncatedImageError:
        with pytest.raises(TruncatedImageError):
            decode_array(data)
    else:
        assert np.array_equal(decode_array(data), expected)


def test_unknown_filter_type_is_pillows_error():
    data = make_png(RGB, ROWS["sub"])
    raw = bytearray(zlib.decompress(_idat(data)))
    raw[(W * 3 + 1) * 5] = 5  # row 5: filter type 5 does not exist
    bad = make_png(RGB, ROWS["sub"], stream=lambda _: zlib.compress(bytes(raw)))
    assert png.decode_plain_png(bad) is None
    with pytest.raises(TruncatedImageError):
        decode_array(bad)


def _idat(data: bytes) -> bytes:
    out, pos = b"", 8
    while pos < len(data):
        (n,) = struct.unpack_from(">I", data, pos)
        if data[pos + 4 : pos + 8] == b"IDAT":
            out += data[pos + 8 : pos + 8 + n]
        pos += 12 + n
    return out


def test_when_the_fast_path_declines_opencv_decodes(monkeypatch):
    import preprocess.decode

    monkeypatch.setattr(preprocess.decode, "decode_plain_png", lambda data: None)
    data = make_png(RGB, ROWS["mixed"])
    assert np.array_equal(decode_array(data), _pillow(data))

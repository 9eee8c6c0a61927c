"""Plain 8-bit PNG decode: ISA-L's inflate plus numpy/torch row unfiltering.

For a large PNG the inflate is most of the decode (libpng and Pillow both use zlib); Intel's ISA-L
inflates the same stream about 2x faster. It comes with the `isal` package (a declared dependency
whose wheels bundle ISA-L).

Scope, checked by `decode_plain_png` itself (anything else returns None and the caller falls back
to OpenCV/Pillow, which own the error reporting): bit depth 8, grey or RGB, no interlace, one run
of IDAT chunks holding exactly one zlib stream that inflates to exactly the image's size (adler32
checked by ISA-L, and the stream must end at the IDAT run's end), and filter types 0-4.

Unfiltering: None, Sub and Up rows (nearly all of what Pillow's and OpenCV's encoders write) are
numpy work (Sub a batched running sum, Up one add per row). Average and Paeth are sequential per
byte, which numpy cannot vectorise: those rows go back to libpng, re-wrapped as a small PNG in
stored (uncompressed) deflate blocks, so the inflate is never paid twice.

The pixels are PNG's defined reconstruction, so they are bit-identical to Pillow's and libpng's.
"""

from __future__ import annotations

import struct

import numpy as np
from isal import isal_zlib

_IHDR = struct.Struct(">IIBBBBB")


def _idat_stream(data: bytes) -> bytes | None:
    """The concatenated payload of the (single, contiguous) run of IDAT chunks, or None."""
    parts: list[memoryview] = []
    view = memoryview(data)
    pos, end, run_closed = 8, len(data), False
    while pos + 12 <= end:
        (length,) = struct.unpack_from(">I", data, pos)
        kind = data[pos + 4 : pos + 8]
        if pos + 12 + length > end:
            return None
        if kind == b"IDAT":
            if run_closed:
                return None  # a second IDAT run: Pillow would stop at the first
            parts.append(view[pos + 8 : pos + 8 + length])
        elif parts:
            run_closed = True
        if kind == b"IEND":
            return b"".join(parts) if parts else None
        pos += 12 + length
    return None


def _inflate(stream: bytes, size: int) -> np.ndarray | None:
    """The `size` bytes `stream` inflates to, or None (bad data, another size, bytes after it)."""
    try:
        out = isal_zlib.decompress(stream, bufsize=size)
    except isal_zlib.error:
        return None
    # ISA-L checked the adler32 at the stream's end; it must also be the last 4 input bytes
    if len(out) != size or len(stream) < 6 or int.from_bytes(stream[-4:], "big") != isal_zlib.adler32(out):
        return None
    return np.frombuffer(out, dtype=np.uint8)


def _unfilter(raw: np.ndarray, bpp: int) -> np.ndarray:
    """(h, 1 + stride) filtered scanlines -> (h, stride) pixels.

    None and Sub rows depend on their own row only: copied / one batched running sum (mod 256).
    Up rows chain through the row above: numpy adds, in order. Average and Paeth are sequential per
    byte, so a chain holding one goes to libpng (`_libpng_rows`); past `_MAX_LIBPNG_RUNS` such
    chains the whole image does.
    """
    import torch  # lazy, as everywhere in preprocess

    h, stride = raw.shape[0], raw.shape[1] - 1
    kinds = raw[:, 0]
    out = np.empty((h, stride), dtype=np.uint8)
    hard_before = np.concatenate(([0], np.cumsum(kinds > 2))).tolist()  # Average/Paeth rows above
    chains = [(a, b, hard_before[b] > hard_before[a]) for a, b in _dependent_chains(kinds)]
    if sum(hard for _, _, hard in chains) > _MAX_LIBPNG_RUNS:
        _libpng_rows(raw, out, 0, h, bpp)
        return out
    rows = raw[:, 1:]
    none = np.flatnonzero(kinds == 0)
    if none.size:
        out[none] = rows[none]
    sub = np.flatnonzero(kinds == 1)
    if sub.size:
        filtered = rows[sub]
        summed = np.empty_like(filtered)  # numpy's buffers, not torch's: huge pages, few faults
        shape = (sub.size, stride // bpp, bpp)
        torch.cumsum(
            torch.from_numpy(filtered).view(shape),
            dim=1,
            dtype=torch.uint8,
            out=torch.from_numpy(summed).view(shape),
        )
        out[sub] = summed
    for a, b, hard in chains:
        if hard:
            _libpng_rows(raw, out, a, b, bpp)
            continue
        if a == 0:  # the row above row 0 is zeros
            out[0] = rows[0]
            a = 1
        for r in range(a, b):
            np.add(rows[r], out[r - 1], out=out[r])
    return out


_MAX_LIBPNG_RUNS = 16


def _dependent_chains(kinds: np.ndarray) -> list[tuple[int, int]]:
    """[start, end) runs of rows filtered Up/Average/Paeth (each needs the row above it)."""
    dependent = np.concatenate(([False], kinds >= 2, [False]))
    edges = np.flatnonzero(dependent[1:] != dependent[:-1])
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist(), strict=True))


def _libpng_rows(raw: np.ndarray, out: np.ndarray, a: int, b: int, bpp: int) -> None:
    """Reconstruct rows [a, b) with libpng: a small PNG of those filtered rows in stored
    (uncompressed) deflate blocks, preceded by the already reconstructed row a - 1 as an
    unfiltered row."""
    import cv2  # lazy, as everywhere in preprocess

    stride = raw.shape[1] - 1
    rows = raw[a:b].reshape(-1)
    if a > 0:
        rows = np.concatenate((np.zeros(1, np.uint8), out[a - 1], rows))
    height = b - a + (a > 0)
    png = _stored_png(rows, stride // bpp, height, 2 if bpp == 3 else 0)
    flags = cv2.IMREAD_COLOR_RGB if bpp == 3 else cv2.IMREAD_GRAYSCALE
    decoded = cv2.imdecode(png, flags | cv2.IMREAD_IGNORE_ORIENTATION)
    if decoded is None or decoded.shape[:2] != (height, stride // bpp):
        raise _Unsupported
    out[a:b] = decoded.reshape(height, stride)[height - (b - a) :]


class _Unsupported(Exception):
    """libpng refused a re-wrapped run (never expected; the caller falls back)."""


_STORED_MAX = 65535  # bytes in one stored deflate block


def _stored_png(scanlines: np.ndarray, width: int, height: int, colour: int) -> np.ndarray:
    """A whole PNG file (uint8 array) whose one IDAT holds `scanlines` in stored deflate blocks."""
    size = scanlines.size
    n = max(1, -(-size // _STORED_MAX))
    zsize = 2 + 5 * n + size + 4
    head = b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, colour, 0, 0, 0))
    png = np.zeros(len(head) + 8 + zsize + 4 + 12, dtype=np.uint8)
    png[: len(head) + 8] = np.frombuffer(head + struct.pack(">I", zsize) + b"IDAT", np.uint8)
    z = png[len(head) + 8 : len(head) + 8 + zsize]
    z[:2] = (0x78, 0x01)
    full = size // _STORED_MAX
    if full:
        blocks = z[2 : 2 + full * (5 + _STORED_MAX)].reshape(full, 5 + _STORED_MAX)
        blocks[:, 1:5] = (0xFF, 0xFF, 0x00, 0x00)
        blocks[:, 5:] = scanlines[: full * _STORED_MAX].reshape(full, _STORED_MAX)
    rest = size - full * _STORED_MAX
    if rest:  # a shorter last block
        at = 2 + full * (5 + _STORED_MAX)
        z[at + 1 : at + 5] = np.frombuffer(struct.pack("<HH", rest, rest ^ 0xFFFF), np.uint8)
        z[at + 5 : at + 5 + rest] = scanlines[full * _STORED_MAX :]
    z[2 + (n - 1) * (5 + _STORED_MAX)] = 1  # BFINAL on the last block
    z[-4:] = np.frombuffer(struct.pack(">I", isal_zlib.adler32(np.ascontiguousarray(scanlines))), np.uint8)
    idat = png[len(head) + 4 : len(head) + 8 + zsize]  # CRC covers type + data
    crc = isal_zlib.crc32(idat)
    tail = struct.pack(">I", crc) + _chunk(b"IEND", b"")
    png[len(head) + 8 + zsize :] = np.frombuffer(tail, np.uint8)
    return png


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = isal_zlib.crc32(body, isal_zlib.crc32(kind))
    return b"".join((struct.pack(">I", len(body)), kind, body, struct.pack(">I", crc)))


def decode_plain_png(data: bytes) -> np.ndarray | None:
    """HxWx3 uint8 RGB pixels of an 8-bit grey/RGB, non-interlaced PNG, or None (see the module
    docstring for what is in scope). The caller has already checked the signature and size limits."""
    if len(data) < 33 or data[12:16] != b"IHDR":
        return None
    width, height, depth, colour, compression, filtering, interlace = _IHDR.unpack_from(data, 16)
    if depth != 8 or colour not in (0, 2) or compression or filtering or interlace:
        return None
    stream = _idat_stream(data)
    if stream is None:
        return None
    bpp = 3 if colour == 2 else 1
    stride = width * bpp
    raw = _inflate(stream, height * (stride + 1))
    if raw is None:
        return None
    raw = raw.reshape(height, stride + 1)
    if int(raw[:, 0].max()) > 4:
        return None  # an unknown filter type: Pillow's error to report
    try:
        pixels = _unfilter(raw, bpp)
    except _Unsupported:
        return None
    if bpp == 3:
        return pixels.reshape(height, width, 3)
    import cv2  # lazy, as everywhere in preprocess

    rgb = np.empty((height, width, 3), dtype=np.uint8)  # grey -> RGB by replication, as convert("RGB")
    return cv2.cvtColor(pixels, cv2.COLOR_GRAY2RGB, dst=rgb)

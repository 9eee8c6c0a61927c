"""Safe decode: bytes -> RGB `PIL.Image`, or a typed `ImageError`. Never an OOM or a hang.

Order of checks, cheapest first: byte count, magic bytes against the allow-list, header-only open
(dimensions known, no pixel decoded), pixel limit, then the full decode of the first frame,
EXIF orientation, and conversion to 8-bit RGB:

* alpha (RGBA, LA, PA, or a palette/grey image with a transparent colour) is composited on white;
* 16-bit grey (`I;16*`, `I`) is scaled to 8 bits (v * 255 / 65535, rounded), not clipped;
  16-bit RGB PNGs are reduced to 8 bits by Pillow itself;
* every other mode (1, L, P, CMYK, YCbCr, ...) goes through Pillow's `convert("RGB")`, which is
  what the reference `Kimi_K25ImageProcessor` does too;
* animated GIF/WebP and multi-page TIFF: the first frame only.
"""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image, ImageFile, ImageOps

from preprocess.config import PreprocessConfig
from preprocess.errors import (
    ImageTooLargeError,
    NotAnImageError,
    TruncatedImageError,
    UnsupportedFormatError,
    ZeroSizeImageError,
)
from preprocess.png import decode_plain_png

_DEFAULT = PreprocessConfig()

# (format, magic at offset 0) for the formats we decode.
_MAGIC: tuple[tuple[str, bytes], ...] = (
    ("JPEG", b"\xff\xd8\xff"),
    ("PNG", b"\x89PNG\r\n\x1a\n"),
    ("GIF", b"GIF87a"),
    ("GIF", b"GIF89a"),
    ("BMP", b"BM"),
    ("TIFF", b"II*\x00"),
    ("TIFF", b"MM\x00*"),
)

# Real image formats we refuse (the error then says "convert it", not "this is not an image").
_OTHER_IMAGE_MAGIC: tuple[tuple[str, bytes], ...] = (
    ("ICO", b"\x00\x00\x01\x00"),
    ("PSD", b"8BPS"),
    ("JPEG 2000", b"\x00\x00\x00\x0cjP  "),
    ("JPEG 2000", b"\xff\x4f\xff\x51"),
    ("JPEG XL", b"\xff\x0a"),
    ("JPEG XL", b"\x00\x00\x00\x0cJXL "),
    ("QOI", b"qoif"),
    ("OpenEXR", b"\x76\x2f\x31\x01"),
    ("DDS", b"DDS "),
    ("BigTIFF", b"II+\x00"),
    ("BigTIFF", b"MM\x00+"),
    ("PDF", b"%PDF"),
    ("PostScript", b"%!PS"),
)
_ISO_BMFF_IMAGE_BRANDS = {b"heic", b"heix", b"hevc", b"heim", b"heis", b"mif1", b"msf1", b"avif", b"avis"}

_DECODE_FAILURES = (OSError, SyntaxError, ValueError, EOFError, zlib.error, struct.error, IndexError)
_SIXTEEN_BIT_MODES = {"I;16", "I;16L", "I;16B", "I;16N", "I"}
_ALPHA_MODES = {"RGBA", "LA", "PA", "RGBa", "La"}


def sniff_format(data: bytes) -> str | None:
    """The allow-listable format named by the magic bytes, or None."""
    for fmt, magic in _MAGIC:
        if data.startswith(magic):
            return fmt
    if len(data) >= 12 and data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "WEBP"
    return None


def _other_image_format(data: bytes) -> str | None:
    for name, magic in _OTHER_IMAGE_MAGIC:
        if data.startswith(magic):
            return name
    if len(data) >= 12 and data[4:8] == b"ftyp" and data[8:12] in _ISO_BMFF_IMAGE_BRANDS:
        return "HEIF/AVIF"
    head = data[:256].lstrip().lower()
    if head.startswith(b"<svg") or (head.startswith(b"<?xml") and b"<svg" in data[:4096].lower()):
        return "SVG"
    return None


def decode_image(data: bytes, config: PreprocessConfig | None = None) -> Image.Image:
    """Decode untrusted bytes into an 8-bit RGB image (see the module docstring for the rules).

    Raises a subclass of `preprocess.errors.ImageError`; nothing else escapes for bad input.
    """
    cfg = config or _DEFAULT
    data, im, fmt = open_checked(data, cfg)
    return _finish_pil(im, fmt, cfg)


def decode_array(data: bytes, config: PreprocessConfig | None = None) -> np.ndarray:
    """Like `decode_image`, as a writable HxWx3 uint8 array; the pipeline's entry point.

    Same checks, same pixels. Plain 8-bit RGB/grey JPEG and PNG (the bulk of uploads) are decoded
    by OpenCV straight into the array: bit-identical to Pillow (both libjpeg-turbo / libpng+zlib)
    and it skips Pillow's internal 4-byte layout and its repacking copy. Plain PNGs try ISA-L's inflate
    first (`preprocess.png`, same pixels, faster inflate). Anything else, and any file these
    refuse, takes the Pillow path, which owns the error reporting.
    """
    cfg = config or _DEFAULT
    data, im, fmt = open_checked(data, cfg)
    if _fast_path_ok(data, im, fmt, cfg):
        arr = decode_plain_png(data) if fmt == "PNG" else None
        if arr is None:
            arr = _cv2_decode(data, im.size)
        if arr is not None and arr.shape[:2] == im.size[::-1]:
            return arr
    return np.array(_finish_pil(im, fmt, cfg))


def open_checked(data: bytes, cfg: PreprocessConfig) -> tuple[bytes, Image.Image, str]:
    """All checks that need no pixel decode; returns (bytes, lazily opened image, format)."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"decode_image takes bytes, got {type(data).__name__}")
    data = bytes(data)
    if not data:
        raise ZeroSizeImageError("the upload is empty (0 bytes); attach the image file itself", {"bytes": 0})
    if len(data) > cfg.max_bytes:
        raise ImageTooLargeError(
            f"the upload is {len(data)} bytes, over the {cfg.max_bytes}-byte limit; "
            "send a smaller or more compressed image",
            {"reason": "bytes", "bytes": len(data), "limit": cfg.max_bytes},
        )
    fmt = sniff_format(data)
    if fmt is None:
        other = _other_image_format(data)
        if other is not None:
            raise UnsupportedFormatError(
                f"{other} images are not accepted; convert it to one of {', '.join(cfg.allowed_formats)}",
                {"format": other, "allowed": list(cfg.allowed_formats)},
            )
        raise NotAnImageError(
            "these bytes are not an image (no known image signature), whatever the file name says; "
            f"attach a {', '.join(cfg.allowed_formats)} file",
            {"head": data[:8].hex()},
        )
    if fmt not in cfg.allowed_formats:
        raise UnsupportedFormatError(
            f"{fmt} images are not accepted here; convert it to one of {', '.join(cfg.allowed_formats)}",
            {"format": fmt, "allowed": list(cfg.allowed_formats)},
        )
    declared = _declared_size(data, fmt)
    if declared is not None:
        _check_size(*declared, fmt, cfg)
    return data, _open_header(data, fmt, cfg), fmt


def _finish_pil(im: Image.Image, fmt: str, cfg: PreprocessConfig) -> Image.Image:
    im = _load_first_frame(im, fmt)
    if cfg.apply_exif_orientation:
        im = _apply_orientation(im)
    return to_rgb(im)


def _orientation(im: Image.Image) -> int:
    try:
        return int(im.getexif().get(0x0112, 1) or 1)
    except _DECODE_FAILURES:
        return 1  # unreadable EXIF is ignored, as every viewer does


def _fast_path_ok(data: bytes, im: Image.Image, fmt: str, cfg: PreprocessConfig) -> bool:
    if fmt not in ("JPEG", "PNG") or im.mode not in ("RGB", "L") or "transparency" in im.info:
        return False
    if getattr(im, "n_frames", 1) != 1:  # APNG, MPO: Pillow picks the first frame
        return False
    if fmt == "JPEG":
        # A truncated JPEG decodes "successfully" in OpenCV (grey fill); only complete files go there.
        if im.format != "JPEG" or not data.rstrip(b"\x00").endswith(b"\xff\xd9"):
            return False
    elif fmt == "PNG":
        # 8-bit samples only (16-bit reduction may differ); eXIf may sit after the pixel data.
        # (Pillow's getexif() on a PNG decodes the whole image to look for it, hence the chunk walk.)
        kinds = _png_chunk_kinds(data)
        return data[24] == 8 and kinds is not None and b"eXIf" not in kinds
    else:
        return False
    return not (cfg.apply_exif_orientation and _orientation(im) != 1)


def _png_chunk_kinds(data: bytes) -> set[bytes] | None:
    """The chunk types of a PNG, from the chunk headers alone (None if the layout is broken)."""
    kinds: set[bytes] = set()
    pos, end = 8, len(data)
    while pos + 8 <= end:
        (length,) = struct.unpack_from(">I", data, pos)
        kind = data[pos + 4 : pos + 8]
        kinds.add(kind)
        pos += 12 + length
        if kind == b"IEND":
            return kinds
    return None


def _cv2_decode(data: bytes, size: tuple[int, int]) -> np.ndarray | None:
    import cv2  # lazy: importing `preprocess` stays cheap

    flags = cv2.IMREAD_COLOR_RGB | cv2.IMREAD_IGNORE_ORIENTATION
    try:
        arr = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), flags)
    except cv2.error:
        return None
    width, height = size
    if arr is None or arr.shape != (height, width, 3) or arr.dtype != np.uint8:
        return None
    return arr


def _open_header(data: bytes, fmt: str, cfg: PreprocessConfig) -> Image.Image:
    try:
        # Pillow's own bomb check (an error past 2x its MAX_IMAGE_PIXELS) is only a backstop for
        # formats whose size we cannot read ourselves; ours, right after, is the one that decides.
        im = Image.open(io.BytesIO(data), formats=[fmt])
    except Image.DecompressionBombError as exc:
        raise ImageTooLargeError(
            f"the {fmt} header declares more pixels than allowed (decompression bomb?); "
            "send an image under the pixel limit",
            {"reason": "pixels", "format": fmt, "limit": cfg.max_pixels, "detail": str(exc)},
        ) from None
    except _DECODE_FAILURES as exc:
        raise TruncatedImageError(
            f"the {fmt} header is unreadable (truncated or corrupt file); re-export or re-upload the complete file",
            {"format": fmt, "detail": str(exc)},
        ) from None
    _check_size(*im.size, fmt, cfg)
    return im


def _declared_size(data: bytes, fmt: str) -> tuple[int, int] | None:
    """(width, height) read straight from the header for formats with a fixed layout, so a zero
    or absurd size is reported as such even where Pillow would refuse the header outright."""
    try:
        if fmt == "PNG" and data[12:16] == b"IHDR":
            return struct.unpack(">II", data[16:24])
        if fmt == "GIF":
            return struct.unpack("<HH", data[6:10])
        if fmt == "BMP" and struct.unpack("<I", data[14:18])[0] >= 40:
            width, height = struct.unpack("<ii", data[18:26])
            return abs(width), abs(height)
    except struct.error:
        return None
    return None


def _check_size(width: int, height: int, fmt: str, cfg: PreprocessConfig) -> None:
    if width <= 0 or height <= 0:
        raise ZeroSizeImageError(
            f"the {fmt} image is {width}x{height} pixels; send an image with a visible area",
            {"width": width, "height": height},
        )
    if width * height > cfg.max_pixels:
        raise ImageTooLargeError(
            f"the {fmt} image is {width}x{height} = {width * height} pixels, over the {cfg.max_pixels}-pixel "
            "limit (a decompression bomb is refused before decoding); downscale it before sending",
            {"reason": "pixels", "format": fmt, "width": width, "height": height, "limit": cfg.max_pixels},
        )


def _load_first_frame(im: Image.Image, fmt: str) -> Image.Image:
    if ImageFile.LOAD_TRUNCATED_IMAGES:
        # Someone switched Pillow into "accept truncated data" mode process-wide; we do not.
        raise RuntimeError(
            "PIL.ImageFile.LOAD_TRUNCATED_IMAGES is True in this process; preprocess refuses to run"
        )
    try:
        im.load()  # a freshly opened image is at its first frame; n_frames is not asked (a TIFF walks every page for it)
    except _DECODE_FAILURES as exc:
        raise TruncatedImageError(
            f"the {fmt} pixel data is truncated or corrupt ({exc}); re-export or re-upload the complete file",
            {"format": fmt, "detail": str(exc)},
        ) from None
    return im


def _apply_orientation(im: Image.Image) -> Image.Image:
    if _orientation(im) in (2, 3, 4, 5, 6, 7, 8):
        return ImageOps.exif_transpose(im)
    return im


def to_rgb(im: Image.Image) -> Image.Image:
    """Convert any decoded mode to 8-bit RGB (rules in the module docstring)."""
    mode = im.mode
    if mode == "RGB" and "transparency" not in im.info:
        return im
    if mode in _SIXTEEN_BIT_MODES:
        wide = np.asarray(im).astype(np.int64)
        grey = ((np.clip(wide, 0, 65535) * 255 + 32767) // 65535).astype(np.uint8)
        return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2), "RGB")
    if mode == "F":
        grey = np.clip(np.rint(np.asarray(im, dtype=np.float32)), 0, 255).astype(np.uint8)
        return Image.fromarray(np.repeat(grey[:, :, None], 3, axis=2), "RGB")
    try:
        if mode in _ALPHA_MODES or "transparency" in im.info:
            rgba = im.convert("RGBA")
            white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
            return Image.alpha_composite(white, rgba).convert("RGB")
        return im.convert("RGB")
    except ValueError as exc:
        raise UnsupportedFormatError(
            f"pixel mode {mode} cannot be converted to RGB ({exc}); save the image as 8-bit RGB",
            {"mode": mode},
        ) from None

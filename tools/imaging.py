"""Image access for the image tools, through `preprocess`'s safe decode.

`open_image` is `preprocess.decode_image` (magic-byte format allow-list, byte and pixel limits
checked before any pixel is decoded, truncation refused, EXIF orientation, RGB) with its typed
`ImageError`s turned into a `ToolError` the model can read. `image_header` reads only the header
(for `image_info`, which must not decode 50 Mpx to report a size), using the same magic-byte sniff
and the same pixel limit.
"""

from __future__ import annotations

import warnings
from io import BytesIO
from pathlib import Path

from PIL import Image

from preprocess import ImageError, PreprocessConfig, decode_image, sniff_format
from preprocess.config import ALL_FORMATS
from tools.base import PermanentToolError

MAX_FILE_BYTES = 64 * 1024 * 1024


class ImageDecodeError(PermanentToolError):
    """The attachment is not an image we decode (format, size, corruption)."""


def _read(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ImageDecodeError(f"cannot read the image: {exc.strerror}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ImageDecodeError(f"image file is larger than {MAX_FILE_BYTES} bytes")
    return data


def image_header(path: Path, *, max_pixels: int) -> tuple[str, int, int, str, int]:
    """(format, width, height, mode, frames) from the header only, with the pixel limit checked."""
    data = _read(path)
    fmt = sniff_format(data)
    if fmt is None or fmt not in ALL_FORMATS:
        raise ImageDecodeError("not an image in an accepted format (" + ", ".join(ALL_FORMATS) + ")")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(BytesIO(data), formats=[fmt]) as im:
                (w, h), mode = im.size, im.mode
                frames = int(getattr(im, "n_frames", 1))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageDecodeError("image header declares more pixels than the decoder's pixel limit") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageDecodeError(f"the {fmt} header is unreadable ({type(exc).__name__})") from None
    if w * h > max_pixels:
        raise ImageDecodeError(f"image is {w}x{h} = {w * h} pixels; the limit is {max_pixels}")
    return fmt, w, h, mode, frames


def open_image(path: Path, *, max_pixels: int) -> Image.Image:
    """Decode to 8-bit RGB via `preprocess.decode_image`; raises `ImageDecodeError`."""
    data = _read(path)
    try:
        return decode_image(data, PreprocessConfig(max_pixels=max_pixels, max_bytes=MAX_FILE_BYTES))
    except ImageError as exc:
        raise ImageDecodeError(str(exc), details={"code": exc.code, **exc.details}) from None

"""Safe image decode for the image tools, behind one function so it can move to `preprocess`.

`preprocess/` (written in parallel) will own decode/validation; until its safe-decode API exists,
`open_image` does the same checks here with Pillow: a format allow-list, the pixel limit checked
from the header before any pixel is decoded (a decompression bomb is a clear error, not an OOM),
`Image.verify()` on a first open, then a fresh open for the real decode, EXIF orientation applied.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from PIL import Image, ImageOps

from tools.base import PermanentToolError

ALLOWED_FORMATS = frozenset({"PNG", "JPEG", "GIF", "WEBP", "BMP", "TIFF"})
MAX_FILE_BYTES = 64 * 1024 * 1024


class ImageDecodeError(PermanentToolError):
    """The attachment is not an image we decode (format, size, corruption)."""


def image_header(path: Path, *, max_pixels: int) -> tuple[str, int, int, str, int]:
    """(format, width, height, mode, frames) from the header only, with the pixel limit checked."""
    _check_file(path)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(path, formats=sorted(ALLOWED_FORMATS)) as im:
                fmt, (w, h), mode = im.format or "?", im.size, im.mode
                frames = int(getattr(im, "n_frames", 1))
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageDecodeError("image is larger than the decoder's pixel limit") from None
    except (OSError, ValueError, SyntaxError) as exc:  # PIL.UnidentifiedImageError is an OSError
        raise ImageDecodeError(f"not a decodable image ({type(exc).__name__})") from None
    if w * h > max_pixels:
        raise ImageDecodeError(f"image is {w}x{h} = {w * h} pixels; the limit is {max_pixels}")
    return fmt, w, h, mode, frames


def open_image(path: Path, *, max_pixels: int) -> Image.Image:
    """Decode the first frame to RGB(A) after verification; raises `ImageDecodeError`."""
    image_header(path, max_pixels=max_pixels)
    try:
        with Image.open(path, formats=sorted(ALLOWED_FORMATS)) as im:
            im.verify()  # structural check (truncation, bad CRCs) without decoding into memory
        with Image.open(path, formats=sorted(ALLOWED_FORMATS)) as im:
            im.seek(0)
            im.load()
            out = ImageOps.exif_transpose(im)
            return out.convert("RGBA" if "A" in out.getbands() else "RGB")
    except (Image.DecompressionBombError, Image.DecompressionBombWarning):
        raise ImageDecodeError("image is larger than the decoder's pixel limit") from None
    except (OSError, ValueError, SyntaxError, EOFError) as exc:
        raise ImageDecodeError(f"image is corrupt or truncated ({type(exc).__name__})") from None


def _check_file(path: Path) -> None:
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ImageDecodeError(f"cannot read the image: {exc.strerror}") from None
    if size > MAX_FILE_BYTES:
        raise ImageDecodeError(f"image file is {size} bytes; the limit is {MAX_FILE_BYTES}")

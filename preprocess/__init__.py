"""Image preprocessing: safe decode, redaction, resize to the patch grid, patchify, content addressing.

Public API (light to import: torch and OpenCV load on first use):

    config = PreprocessConfig(max_patches=16384)
    result = process_image(data, config)        # ProcessedImage: pixel_values, grid_thw, content_hash, redaction
    image = decode_image(data, config)          # PIL.Image in RGB, for tools that need pixels
    pixels = decode_array(data, config)         # the same pixels as an HxWx3 uint8 array
    pixels, record = preprocess.redact.redact(pixels, config)  # the pipeline's first step (no-op unless enabled)
    store = BlobStore("s3://bucket/blobs")      # or a local directory (default); any fsspec URL
    cached = ProcessedCache(store).process(data, config)   # the same image + settings processed once

Errors are `ImageError` subclasses (see `preprocess.errors`), each with a message that says what to do.
"""

from preprocess.config import PIPELINE_VERSION, PreprocessConfig
from preprocess.decode import decode_array, decode_image, sniff_format
from preprocess.errors import (
    ImageError,
    ImageTooLargeError,
    NotAnImageError,
    RedactionUnavailableError,
    TruncatedImageError,
    UnsupportedFormatError,
    ZeroSizeImageError,
    error_from_dict,
)
from preprocess.pipeline import CachedResult, ProcessedCache, ProcessedImage, content_hash, process_image
from preprocess.redact import RedactionBox, RedactionRecord
from preprocess.store import DEFAULT_BLOB_URL, BlobCorruptError, BlobNotFoundError, BlobStore

__all__ = [
    "DEFAULT_BLOB_URL",
    "PIPELINE_VERSION",
    "BlobCorruptError",
    "BlobNotFoundError",
    "BlobStore",
    "CachedResult",
    "ImageError",
    "ImageTooLargeError",
    "NotAnImageError",
    "PreprocessConfig",
    "ProcessedCache",
    "ProcessedImage",
    "RedactionBox",
    "RedactionRecord",
    "RedactionUnavailableError",
    "TruncatedImageError",
    "UnsupportedFormatError",
    "ZeroSizeImageError",
    "content_hash",
    "decode_array",
    "decode_image",
    "error_from_dict",
    "process_image",
    "sniff_format",
]

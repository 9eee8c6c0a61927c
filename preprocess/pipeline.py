"""bytes -> `ProcessedImage`: decode, redact, hash, resize, pad, normalise, patchify; and its cache.

The content hash names the processed result: SHA-256 over the pipeline version, the
output-affecting settings (`PreprocessConfig.fingerprint()`), the image size and the first pixels
any later stage sees: the decoded RGB pixels, or with redaction on the redacted pixels at the size
the model sees them (detection runs on a small grey copy of the decode, the blur on the resized
image, so neither costs what a 12-megapixel original would). The inference prefix cache keys
images on it. `ProcessedCache` makes "the same image + settings" run once: looked up by
source-bytes hash + settings before decoding, and by content hash after.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from preprocess.config import PIPELINE_VERSION, PreprocessConfig
from preprocess.decode import decode_array
from preprocess.patchify import normalize_patches, patchify_u8, resize_rgb, target_size
from preprocess.redact import RedactionRecord, detect, obscure
from preprocess.store import BlobStore, sha256_hex

_MAGIC = b"DZPP1\n"  # float32 patches
_MAGIC_U8 = b"DZPP2\n"  # uint8 patches + the normalisation: 4x smaller, the same floats on load


@dataclass(frozen=True, slots=True, eq=False)
class ProcessedImage:
    pixel_values: np.ndarray  # float32[num_patches, 3, patch, patch], the reference's layout
    grid_thw: np.ndarray  # int64[1, 3]: [[1, grid_h, grid_w]]
    content_hash: str
    redaction: RedactionRecord
    source_size: tuple[int, int]  # (height, width) after EXIF orientation
    resized_size: tuple[int, int]  # (height, width) before padding
    # The uint8 planar patches `pixel_values` were normalised from, with the normalisation's
    # (mean, std); when present, `to_bytes` stores these instead of the floats.
    patches_u8: np.ndarray | None = None
    normalization: tuple[tuple[float, ...], tuple[float, ...]] | None = None

    @property
    def num_patches(self) -> int:
        return int(self.pixel_values.shape[0])

    def grid_list(self) -> list[list[int]]:
        return [[int(v) for v in row] for row in self.grid_thw]

    def to_bytes(self) -> bytes:
        """Deterministic serialisation (same result -> same bytes -> same blob hash)."""
        meta: dict[str, Any] = {
            "content_hash": self.content_hash,
            "grid_thw": self.grid_list(),
            "shape": list(self.pixel_values.shape),
            "dtype": "float32",
            "redaction": self.redaction.to_dict(),
            "source_size": list(self.source_size),
            "resized_size": list(self.resized_size),
        }
        if self.patches_u8 is not None and self.normalization is not None:
            meta.update(dtype="uint8", mean=list(self.normalization[0]), std=list(self.normalization[1]))
            magic, pixels = _MAGIC_U8, np.ascontiguousarray(self.patches_u8, dtype=np.uint8)
        else:
            magic, pixels = _MAGIC, np.ascontiguousarray(self.pixel_values, dtype="<f4")
        head = json.dumps(meta, sort_keys=True).encode()
        return b"".join((magic, struct.pack("<Q", len(head)), head, pixels.tobytes()))

    @classmethod
    def from_bytes(cls, blob: bytes) -> ProcessedImage:
        if not blob.startswith((_MAGIC, _MAGIC_U8)):
            raise ValueError("not a serialised ProcessedImage")
        (n,) = struct.unpack_from("<Q", blob, len(_MAGIC))
        start = len(_MAGIC) + 8
        meta = json.loads(blob[start : start + n])
        shape = meta["shape"]
        u8 = norm = None
        if meta["dtype"] == "uint8":
            u8 = np.frombuffer(blob, dtype=np.uint8, offset=start + n).reshape(shape[0], 3, -1)
            norm = (tuple(meta["mean"]), tuple(meta["std"]))
            cfg = PreprocessConfig(patch_size=int(shape[2]), image_mean=norm[0], image_std=norm[1])
            pixels = normalize_patches(u8, cfg)
        else:
            pixels = np.frombuffer(blob, dtype="<f4", offset=start + n).reshape(shape)
        return cls(
            pixel_values=pixels,
            grid_thw=np.asarray(meta["grid_thw"], dtype=np.int64),
            content_hash=meta["content_hash"],
            redaction=RedactionRecord.from_dict(meta["redaction"]),
            source_size=tuple(meta["source_size"]),
            resized_size=tuple(meta["resized_size"]),
            patches_u8=u8,
            normalization=norm,
        )


def content_hash(rgb: np.ndarray, config: PreprocessConfig) -> str:
    """SHA-256 of (pipeline version, settings fingerprint, size, RGB uint8 pixels)."""
    h, w, c = rgb.shape
    digest = hashlib.sha256(f"{PIPELINE_VERSION}\0{config.fingerprint()}\0{h}x{w}x{c}\0".encode())
    digest.update(np.ascontiguousarray(rgb).data)
    return digest.hexdigest()


def decode_rgb_array(data: bytes, config: PreprocessConfig) -> np.ndarray:
    """Decoded 8-bit RGB pixels as an HxWx3 array (the input of every later stage)."""
    return decode_array(data, config)


def _model_view(rgb: np.ndarray, config: PreprocessConfig) -> tuple[np.ndarray, RedactionRecord]:
    """(the pixels to hash and patchify, redaction record). Without redaction: the decode itself;
    with it: resized to the model's size first, then the detected boxes obscured there."""
    record = detect(rgb, config)
    if not record.enabled:
        return rgb, record
    (new_h, new_w), _ = target_size(rgb.shape[0], rgb.shape[1], config)
    return obscure(resize_rgb(rgb, new_h, new_w), record, rgb.shape[:2]), record


def process_rgb(rgb: np.ndarray, config: PreprocessConfig) -> ProcessedImage:
    """Everything after decode: redact, hash, resize, pad, normalise, patchify."""
    view, record = _model_view(rgb, config)
    return _finish(view, record, content_hash(view, config), config, rgb.shape[:2])


def process_image(data: bytes, config: PreprocessConfig | None = None) -> ProcessedImage:
    """Untrusted image bytes -> model-ready patches (raises `ImageError` subclasses for bad input)."""
    cfg = config or PreprocessConfig()
    return process_rgb(decode_rgb_array(data, cfg), cfg)


@dataclass(frozen=True, slots=True, eq=False)
class CachedResult:
    image: ProcessedImage
    processed_sha256: str  # blob holding `image.to_bytes()`
    cache_hit: bool
    # With redaction on (and for rendered PDF pages): blob of the image as a PNG, at the size the
    # model sees it. This (never the original) is what a model server that takes bytes is sent.
    redacted_sha256: str | None = None


class ProcessedCache:
    """Processed results in a `BlobStore`, indexed by source hash + settings and by content hash."""

    BY_SOURCE = "processed-by-source"
    BY_CONTENT = "processed-by-content"
    REDACTED = "redacted-by-content"  # content hash -> the model-size PNG

    def __init__(self, store: BlobStore) -> None:
        self.store = store

    def load(self, processed_sha256: str) -> ProcessedImage:
        return ProcessedImage.from_bytes(self.store.get(processed_sha256))

    def _hit(self, namespace: str, key: str, *, need_png: bool = False) -> CachedResult | None:
        sha = self.store.get_ref(namespace, key)
        if sha is None or not self.store.exists(sha):
            return None
        image = self.load(sha)
        redacted = None
        if image.redaction.enabled or need_png:
            redacted = self.store.get_ref(self.REDACTED, image.content_hash)
            if redacted is None or not self.store.exists(redacted):
                return None  # an index written without its redacted image: recompute
        return CachedResult(image, sha, cache_hit=True, redacted_sha256=redacted)

    def process(
        self, data: bytes, config: PreprocessConfig, *, source_sha256: str | None = None
    ) -> CachedResult:
        source_key = f"{source_sha256 or sha256_hex(data)}-{config.fingerprint()}"
        hit = self._hit(self.BY_SOURCE, source_key)
        if hit is not None:
            return hit
        hit = self.process_pixels(decode_rgb_array(data, config), config)
        self.store.set_ref(self.BY_SOURCE, source_key, hit.processed_sha256)
        return hit

    def process_pixels(
        self, rgb: np.ndarray, config: PreprocessConfig, *, keep_png: bool = False
    ) -> CachedResult:
        """Decoded pixels -> stored result, looked up by content hash first. The model-size PNG is
        stored with redaction on, or when `keep_png` (rendered PDF pages: there is no original)."""
        view, record = _model_view(rgb, config)
        digest = content_hash(view, config)
        keep_png = keep_png or record.enabled
        hit = self._hit(self.BY_CONTENT, digest, need_png=keep_png)
        if hit is not None:
            return hit
        image = _finish(view, record, digest, config, rgb.shape[:2])
        png = None
        if keep_png:
            (h, w) = image.resized_size
            png = self.store.put(encode_png(resize_rgb(view, h, w)))
            self.store.set_ref(self.REDACTED, digest, png)
        sha = self.store.put(image.to_bytes())
        self.store.set_ref(self.BY_CONTENT, digest, sha)
        return CachedResult(image, sha, cache_hit=False, redacted_sha256=png)


def encode_png(rgb: np.ndarray) -> bytes:
    """Lossless PNG of an HxWx3 uint8 array (fast zlib level: it is read once, by a model server)."""
    import cv2

    ok, buf = cv2.imencode(".png", cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_PNG_COMPRESSION, 1])
    if not ok:
        raise RuntimeError("PNG encoding of the redacted image failed")
    return buf.tobytes()


def _finish(
    rgb: np.ndarray,
    record: RedactionRecord,
    digest: str,
    config: PreprocessConfig,
    source_size: tuple[int, int],
) -> ProcessedImage:
    """`rgb` is the decode (`source_size`) or already the resized model view (then not resized again)."""
    height, width = source_size
    (new_h, new_w), (pad_h, pad_w) = target_size(height, width, config)
    planar = patchify_u8(resize_rgb(rgb, new_h, new_w), pad_h, pad_w, config)
    p = config.patch_size
    return ProcessedImage(
        pixel_values=normalize_patches(planar, config),
        grid_thw=np.array([[1, pad_h // p, pad_w // p]], dtype=np.int64),
        content_hash=digest,
        redaction=record,
        source_size=(height, width),
        resized_size=(new_h, new_w),
        patches_u8=planar,
        normalization=(config.image_mean, config.image_std),
    )


def describe(result: CachedResult) -> dict[str, Any]:
    """JSON summary of a cached result (what jobs return; pixels stay in the blob store)."""
    return {
        "content_hash": result.image.content_hash,
        "grid_thw": result.image.grid_list(),
        "processed_sha256": result.processed_sha256,
        "redaction": result.image.redaction.to_dict(),
        "redacted_sha256": result.redacted_sha256,
    }

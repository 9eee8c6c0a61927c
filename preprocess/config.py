"""Preprocessing settings: one frozen object, passed explicitly, JSON round-trippable."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

# Bumped whenever a change alters output pixels for the same input and settings: it is part of the
# content hash, so stale processed results and prefix-cache entries are never reused.
PIPELINE_VERSION = "dayzero-preprocess/2"  # 2: redaction blurs at model resolution

PDF_MEDIA_TYPE = "application/pdf"  # attachments of this type are parsed by `preprocess.pdf`

ALL_FORMATS: tuple[str, ...] = ("JPEG", "PNG", "WEBP", "GIF", "BMP", "TIFF")

# Settings that change the output tensor; limits and the allow-list only decide accept/reject.
_OUTPUT_FIELDS: tuple[str, ...] = (
    "patch_size",
    "merge_size",
    "max_patches",
    "max_size_per_side",
    "image_mean",
    "image_std",
    "apply_exif_orientation",
    "redact_faces",
    "redact_documents",
    "redaction_mode",
)


@dataclass(frozen=True, slots=True)
class PreprocessConfig:
    """Defaults are those of `transformers`' `Kimi_K25ImageProcessor` (patch 14, merge 2,
    16384 patches, at most 512 patches per side, mean = std = 0.5 after rescaling to [0, 1])."""

    patch_size: int = 14
    merge_size: int = 2
    max_patches: int = 16384
    max_size_per_side: int = 512  # in patches, as the reference's size["max_height"]
    image_mean: tuple[float, float, float] = (0.5, 0.5, 0.5)
    image_std: tuple[float, float, float] = (0.5, 0.5, 0.5)
    # Limits, checked before any pixel is decoded.
    max_bytes: int = 64 * 1024 * 1024
    max_pixels: int = 50_000_000
    allowed_formats: tuple[str, ...] = ALL_FORMATS
    apply_exif_orientation: bool = True
    # Privacy redaction (off unless a tenant or task asks for it).
    redact_faces: bool = False
    redact_documents: bool = False
    redaction_mode: Literal["blur", "black"] = "blur"
    # PDFs (see `preprocess.pdf`): pages needing vision (scans, figures) are rendered at pdf_dpi.
    pdf_dpi: int = 100
    pdf_max_pages: int = 1000
    pdf_max_vision_pages: int = 100  # page images per document; later pages go as text only
    pdf_max_chars_per_page: int = 100_000

    def __post_init__(self) -> None:
        for name in (
            "patch_size",
            "merge_size",
            "max_patches",
            "max_size_per_side",
            "max_bytes",
            "max_pixels",
            "pdf_dpi",
            "pdf_max_pages",
            "pdf_max_chars_per_page",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"PreprocessConfig.{name} must be a positive integer, got {value!r}")
        for name in ("image_mean", "image_std"):
            value = getattr(self, name)
            if len(value) != 3:
                raise ValueError(f"PreprocessConfig.{name} needs one value per RGB channel, got {value!r}")
            object.__setattr__(self, name, tuple(float(v) for v in value))
        if any(s <= 0 for s in self.image_std):
            raise ValueError(f"PreprocessConfig.image_std must be positive, got {self.image_std!r}")
        formats = tuple(str(f).upper() for f in self.allowed_formats)
        unknown = sorted(set(formats) - set(ALL_FORMATS))
        if unknown:
            raise ValueError(
                f"PreprocessConfig.allowed_formats: unsupported {unknown}; choose from {ALL_FORMATS}"
            )
        object.__setattr__(self, "allowed_formats", formats)
        if not isinstance(self.pdf_max_vision_pages, int) or self.pdf_max_vision_pages < 0:
            raise ValueError(
                f"PreprocessConfig.pdf_max_vision_pages must be >= 0, got {self.pdf_max_vision_pages!r}"
            )
        if self.redaction_mode not in ("blur", "black"):
            raise ValueError(
                f"PreprocessConfig.redaction_mode must be 'blur' or 'black', got {self.redaction_mode!r}"
            )

    @property
    def redaction_enabled(self) -> bool:
        return self.redact_faces or self.redact_documents

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key, value in out.items():
            if isinstance(value, tuple):
                out[key] = list(value)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> PreprocessConfig:
        """Build from JSON (lists for tuples). Unknown keys are an error, not silently ignored."""
        data = dict(data or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"unknown PreprocessConfig fields {unknown}; known: {sorted(names)}")
        for key in ("image_mean", "image_std", "allowed_formats"):
            if key in data:
                data[key] = tuple(data[key])
        return cls(**data)

    def fingerprint(self) -> str:
        """SHA-256 over the pipeline version and the settings that affect output pixels."""
        return _fingerprint(self, tuple(repr(getattr(self, k)) for k in _OUTPUT_FIELDS))


@functools.lru_cache(maxsize=64)  # part of every content hash, ~0.3 ms to build
def _fingerprint(config: PreprocessConfig, reprs: tuple[str, ...]) -> str:
    """`reprs` only widens the cache key: 0.0 == -0.0, yet they serialise differently."""
    full = config.to_dict()
    payload = {"version": PIPELINE_VERSION, **{k: full[k] for k in _OUTPUT_FIELDS}}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()

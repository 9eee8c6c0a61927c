"""PDF attachments -> text per page + page images for the pages that need vision.

Parsed with PDFium (`pypdfium2`). Each page gives its text; a page that holds raster images
(a scan, a photo, a figure) or only vector drawing with little text is also rendered at
`config.pdf_dpi` and goes through the image pipeline like any image (redaction included, then
patches, content hash). Limits, checked before the expensive part: bytes, page count, characters
per page, rendered pixels per page (the DPI is lowered for a huge page instead of allocating it),
and page images per document. Encrypted, malformed and oversized PDFs raise typed
`DocumentError`s; nothing a PDF says is trusted for sizes.

`process_document` stores every page image like an
image attachment and one JSON manifest naming them: that manifest is the attachment's processed
result.
"""

from __future__ import annotations

import json
import re
import threading
import zlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from preprocess.config import PreprocessConfig
from preprocess.errors import (
    DocumentTooLargeError,
    EncryptedDocumentError,
    ImageError,
    MalformedDocumentError,
)
from preprocess.pipeline import ProcessedCache

MANIFEST_KIND = "dayzero-document/1"
_MIN_TEXT_CHARS = 32  # fewer characters than this on a page with drawing: it is a figure/scan
_STREAM = re.compile(rb"stream\r?\n")
_INFLATE_STEP = 1 << 20
# PDFium is not thread-safe: one document operation at a time per process.
_PDFIUM_LOCK = threading.Lock()


@dataclass(frozen=True, slots=True)
class ParsedPage:
    index: int  # 0-based
    text: str
    vision: str | None = None  # why the page is also an image: "raster" | "drawing" | None
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class ParsedDocument:
    pages: tuple[ParsedPage, ...]
    page_images: dict[int, np.ndarray] = field(default_factory=dict)  # index -> HxWx3 uint8 RGB
    skipped_vision_pages: int = 0  # pages that needed vision past `pdf_max_vision_pages`


def check_inflation(data: bytes, config: PreprocessConfig) -> None:
    """Refuse decompression bombs before PDFium inflates anything: no Flate stream may inflate to
    more than an image within the pixel limit could need (`max_pixels` x 4 bytes). Each stream is
    inflated in 1 MiB steps and dropped as it goes, so the check itself stays small."""
    limit = config.max_pixels * 4
    view = memoryview(data)
    for match in _STREAM.finditer(data):
        inflater = zlib.decompressobj()
        try:
            total = len(inflater.decompress(view[match.end() :], _INFLATE_STEP))
            while inflater.unconsumed_tail and total <= limit:
                total += len(inflater.decompress(inflater.unconsumed_tail, _INFLATE_STEP))
        except zlib.error:
            continue  # not Flate data (JPEG, raw, other filters): PDFium's own limits apply
        if total > limit:
            raise DocumentTooLargeError(
                f"a stream in the PDF inflates to more than {limit} bytes (a decompression bomb)",
                {"offset": match.end(), "limit": limit},
            )


def _open(data: bytes) -> Any:
    import pypdfium2 as pdfium

    if not data.lstrip()[:5].startswith(b"%PDF-"):
        raise MalformedDocumentError("the attachment is not a PDF (no %PDF- header)", {})
    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        msg = str(exc)
        if "password" in msg.lower():
            raise EncryptedDocumentError(
                "the PDF is encrypted (password protected); send it decrypted", {"pdfium": msg}
            ) from None
        raise MalformedDocumentError(f"the PDF cannot be read: {msg}", {"pdfium": msg}) from None


def _page_objects(page: Any) -> tuple[int, int]:
    """(raster image objects, path objects) on the page, nested forms included."""
    import pypdfium2.raw as raw

    images = paths = 0
    for obj in page.get_objects(max_depth=4):
        if obj.type == raw.FPDF_PAGEOBJ_IMAGE:
            images += 1
        elif obj.type == raw.FPDF_PAGEOBJ_PATH:
            paths += 1
    return images, paths


def _render(page: Any, config: PreprocessConfig) -> np.ndarray:
    width_pt, height_pt = page.get_size()
    scale = config.pdf_dpi / 72.0
    pixels = max(1.0, width_pt * scale) * max(1.0, height_pt * scale)
    if pixels > config.max_pixels:  # a huge page: lower the DPI, never allocate the giant bitmap
        scale *= (config.max_pixels / pixels) ** 0.5
    if width_pt * scale < 1 or height_pt * scale < 1:
        raise DocumentTooLargeError(
            f"a page of {width_pt:.0f}x{height_pt:.0f} pt cannot be rendered within the pixel limit",
            {"width_pt": width_pt, "height_pt": height_pt},
        )
    bitmap = page.render(scale=scale, rev_byteorder=True)  # RGB(A) byte order
    rgb = np.array(bitmap.to_numpy()[..., :3], copy=True)
    bitmap.close()
    return rgb


def parse_pdf(data: bytes, config: PreprocessConfig | None = None) -> ParsedDocument:
    """Untrusted PDF bytes -> text per page and the page images that need vision."""
    cfg = config or PreprocessConfig()
    if len(data) > cfg.max_bytes:
        raise DocumentTooLargeError(
            f"the PDF has {len(data)} bytes, more than the limit of {cfg.max_bytes}",
            {"bytes": len(data), "limit": cfg.max_bytes},
        )
    check_inflation(data, cfg)
    with _PDFIUM_LOCK:
        pdf = _open(data)
        try:
            n = len(pdf)
            if n > cfg.pdf_max_pages:
                raise DocumentTooLargeError(
                    f"the PDF has {n} pages, more than the limit of {cfg.pdf_max_pages}; split it",
                    {"pages": n, "limit": cfg.pdf_max_pages},
                )
            if n == 0:
                raise MalformedDocumentError("the PDF has no pages", {})
            pages, images, skipped = [], {}, 0
            for i in range(n):
                page = pdf[i]
                try:
                    text, truncated = _page_text(page, cfg)
                    raster, paths = _page_objects(page)
                    vision = (
                        "raster"
                        if raster
                        else ("drawing" if paths and len(text.strip()) < _MIN_TEXT_CHARS else None)
                    )
                    if vision is not None:
                        if len(images) < cfg.pdf_max_vision_pages:
                            images[i] = _render(page, cfg)
                        else:
                            skipped += 1
                    pages.append(ParsedPage(i, text, vision, truncated))
                finally:
                    page.close()
        except ImageError:
            raise
        except Exception as exc:  # PDFium on a damaged page: a clear error, never a crash
            raise MalformedDocumentError(
                f"the PDF cannot be read: {exc}", {"error": type(exc).__name__}
            ) from None
        finally:
            pdf.close()
    return ParsedDocument(tuple(pages), images, skipped)


def _page_text(page: Any, config: PreprocessConfig) -> tuple[str, bool]:
    textpage = page.get_textpage()
    try:
        count = textpage.count_chars()
        limit = config.pdf_max_chars_per_page
        text = textpage.get_text_range(0, min(count, limit)) if count > 0 else ""
    finally:
        textpage.close()
    return text.replace("\r\n", "\n").replace("\r", "\n"), count > limit


def process_document(
    cache: ProcessedCache, data: bytes, config: PreprocessConfig, *, source_sha256: str | None = None
) -> dict[str, Any]:
    """Parse a PDF, store its page images like image attachments (redacted when configured) and a
    manifest blob; returns the job result (`processed_sha256` is the manifest's blob)."""
    from preprocess.store import sha256_hex

    source_key = f"{source_sha256 or sha256_hex(data)}-{config.fingerprint()}-pdf"
    sha = cache.store.get_ref(cache.BY_SOURCE, source_key)
    if sha is not None and cache.store.exists(sha):
        manifest = json.loads(cache.store.get(sha))
        return _result(manifest, sha)
    doc = parse_pdf(data, config)
    page_images = []
    faces = documents = 0
    for index, rgb in sorted(doc.page_images.items()):
        stored = cache.process_pixels(rgb, config, keep_png=True)
        rec = stored.image.redaction
        faces, documents = faces + rec.faces, documents + rec.documents
        page_images.append(
            {
                "page": index,
                "processed_sha256": stored.processed_sha256,
                "content_hash": stored.image.content_hash,
                "grid_thw": stored.image.grid_list(),
                "image_sha256": stored.redacted_sha256,
                "redaction": rec.to_dict(),
            }
        )
    manifest = {
        "kind": MANIFEST_KIND,
        "format": "pdf",
        "pages": [
            {"page": p.index, "text": p.text, "vision": p.vision, "truncated": p.truncated} for p in doc.pages
        ],
        "page_images": page_images,
        "skipped_vision_pages": doc.skipped_vision_pages,
        "redaction": {
            "enabled": config.redaction_enabled,
            "mode": config.redaction_mode if config.redaction_enabled else None,
            "faces": faces,
            "documents": documents,
        },
    }
    blob = json.dumps(manifest, sort_keys=True, ensure_ascii=False).encode()
    sha = cache.store.put(blob)
    cache.store.set_ref(cache.BY_SOURCE, source_key, sha)
    return _result(manifest, sha)


def _result(manifest: dict[str, Any], sha: str) -> dict[str, Any]:
    return {
        "kind": "document",
        "content_hash": sha,  # the manifest names every page's text and image hash
        "processed_sha256": sha,
        "grid_thw": None,
        "pages": len(manifest["pages"]),
        "page_images": len(manifest["page_images"]),
        "redaction": manifest["redaction"],
        "redacted_sha256": None,
    }

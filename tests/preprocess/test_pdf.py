"""PDF attachments: text per page, page images for pages that need vision (redacted like any image),
limits, and hostile PDFs failing with typed errors."""

from __future__ import annotations

import json
import time
import zlib

import numpy as np
import pytest

from preprocess import BlobStore, PreprocessConfig, ProcessedCache, ProcessedImage
from preprocess.errors import (
    DocumentTooLargeError,
    EncryptedDocumentError,
    MalformedDocumentError,
)
from preprocess.pdf import parse_pdf, process_document
from tests.preprocess.images import cartoon_face
from tests.preprocess.pdfs import Page, long_contract, make_pdf


def test_text_per_page_and_page_images_only_where_vision_is_needed():
    doc = parse_pdf(long_contract(120, scans=(3, 50)), PreprocessConfig(pdf_dpi=72))
    assert len(doc.pages) == 120
    assert doc.pages[0].text == "Clause 1.1 marker-0001: the parties agree.\nClause 1.2 page 1 ends."
    assert "marker-0120" in doc.pages[119].text
    assert [p.index for p in doc.pages if p.vision] == [3, 50] and doc.pages[3].vision == "raster"
    assert sorted(doc.page_images) == [3, 50]
    assert doc.page_images[3].shape == (792, 612, 3) and doc.page_images[3].dtype == np.uint8  # 72 dpi
    # the 'scan' is drawn on the page: its dark bar is in the rendered pixels
    assert doc.page_images[3].min() < 60


def test_vector_drawing_page_with_little_text_is_rendered():
    drawing = Page()
    drawing.raw_stream = zlib.compress(b"0 0 1 rg 100 100 300 300 re f 1 0 0 RG 50 50 m 500 700 l S")
    doc = parse_pdf(make_pdf([Page(lines=["intro text that is long enough to count as text"]), drawing]))
    assert doc.pages[1].vision == "drawing" and sorted(doc.page_images) == [1]


def test_page_images_are_limited_per_document():
    doc = parse_pdf(
        long_contract(10, scans=(1, 2, 3, 4)), PreprocessConfig(pdf_max_vision_pages=2, pdf_dpi=36)
    )
    assert sorted(doc.page_images) == [1, 2] and doc.skipped_vision_pages == 2
    assert [p.vision for p in doc.pages[1:5]] == ["raster"] * 4  # still marked, as text only


def test_long_page_text_is_truncated_and_marked():
    doc = parse_pdf(make_pdf([Page(lines=["x" * 90] * 40)]), PreprocessConfig(pdf_max_chars_per_page=500))
    assert 450 < len(doc.pages[0].text) <= 500 and doc.pages[0].truncated  # CRLF line ends become LF


@pytest.mark.parametrize(
    ("data", "error", "needle"),
    [
        (make_pdf([Page(lines=["secret"])], encrypted=True), EncryptedDocumentError, "encrypted"),
        (long_contract(5)[:400], MalformedDocumentError, "cannot be read"),
        (b"GIF89a not a pdf at all", MalformedDocumentError, "not a PDF"),
        (b"%PDF-1.7\n" + b"\x00" * 2000, MalformedDocumentError, "cannot be read"),
    ],
    ids=["encrypted", "truncated", "not-a-pdf", "garbage-after-header"],
)
def test_hostile_pdfs_fail_with_typed_errors(data, error, needle):
    with pytest.raises(error, match=needle) as info:
        parse_pdf(data)
    assert info.value.to_dict()["retryable"] is False


def test_too_many_pages_is_refused_before_parsing_them():
    with pytest.raises(DocumentTooLargeError, match="1001 pages"):
        parse_pdf(make_pdf([Page(lines=["x"])] * 1001))
    with pytest.raises(DocumentTooLargeError, match="bytes"):
        parse_pdf(long_contract(3), PreprocessConfig(max_bytes=1000))


def test_decompression_bomb_is_refused_quickly():
    bomb = zlib.compress(b" " * (260 * 1024 * 1024), 9)  # ~250 KB inflating to 260 MB
    data = make_pdf([Page(lines=["cover"]), Page(raw_stream=bomb)])
    t0 = time.process_time()
    with pytest.raises(DocumentTooLargeError, match="decompression bomb"):
        parse_pdf(data)  # default limit: max_pixels x 4 = 200 MB per stream
    assert time.process_time() - t0 < 30  # bounded work, never an OOM (a generous bound, not a benchmark)


def test_huge_page_is_rendered_within_the_pixel_limit():
    img = np.full((20, 20, 3), 90, np.uint8)
    data = make_pdf([Page(image=img)], size=(14400, 14400))  # 200 x 200 inches
    doc = parse_pdf(data, PreprocessConfig(max_pixels=4_000_000, pdf_dpi=300))
    (rgb,) = doc.page_images.values()
    assert rgb.shape[0] * rgb.shape[1] <= 4_000_000 and rgb.shape[0] > 1000


def test_process_document_stores_redacted_page_images_and_a_manifest(tmp_path):
    face = cartoon_face(160)  # a 'scanned' page showing a face
    data = make_pdf([Page(lines=["cover page text " * 4]), Page(lines=["p2"], image=face)])
    cache = ProcessedCache(BlobStore(str(tmp_path)))
    config = PreprocessConfig(redact_faces=True, pdf_dpi=72)
    out = process_document(cache, data, config)
    assert out["kind"] == "document" and out["pages"] == 2 and out["page_images"] == 1
    assert out["redaction"]["enabled"] is True and out["redaction"]["faces"] == 1
    manifest = json.loads(cache.store.get(out["processed_sha256"]))
    assert [p["text"].strip() for p in manifest["pages"]][1] == "p2"
    (page,) = manifest["page_images"]
    image = ProcessedImage.from_bytes(cache.store.get(page["processed_sha256"]))
    assert image.redaction.faces == 1 and page["content_hash"] == image.content_hash
    assert cache.store.get(page["image_sha256"]).startswith(b"\x89PNG")  # what a bytes-only server gets
    plain = process_document(cache, data, PreprocessConfig(pdf_dpi=72))
    plain_page = json.loads(cache.store.get(plain["processed_sha256"]))["page_images"][0]
    assert plain_page["content_hash"] != page["content_hash"]  # the redacted page differs
    assert process_document(cache, data, config) == out  # the same PDF + settings: stored result

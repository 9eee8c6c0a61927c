"""Job functions: plain Python, no Celery.

The Celery tasks in `workers.celery_app` wrap these, and the embedded in-process dispatcher calls
them directly, so both paths run the same code. Payloads and results are JSON; failures raise a
typed exception (`preprocess.ImageError` and subclasses for bad images) that `describe_error`
turns into a JSON description. No retries here: each call is one attempt (the orchestrator owns
retry policy).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from core.payloads import PreprocessJob


@functools.lru_cache(maxsize=8)
def _store(url: str):
    from preprocess import BlobStore

    return BlobStore(url)


def preprocess_attachment(payload: PreprocessJob | Mapping[str, Any]) -> dict[str, Any]:
    """Turn one stored attachment into model-ready patches, stored content-addressed.

    payload: {"attachment_id": str, "blob_sha256": str, "blob_url": str (BlobStore root),
              "config": {PreprocessConfig fields, optional}, "media_type": str (optional)}
    A PDF (media_type application/pdf) is parsed instead (`preprocess.pdf.process_document`):
    its result names a manifest blob (page texts + page images) as `processed_sha256`.
    returns: {"attachment_id", "content_hash", "grid_thw": [[t, h, w]], "processed_sha256",
              "redaction": {...}}; the patches are `ProcessedImage.from_bytes(store.get(processed_sha256))`.
    Idempotent: the same blob and settings return the stored result without recomputing it.
    """
    from preprocess import PreprocessConfig, ProcessedCache
    from preprocess.config import PDF_MEDIA_TYPE
    from preprocess.pipeline import describe
    from workers import metrics
    from workers.telemetry import job_span

    job = payload if isinstance(payload, PreprocessJob) else PreprocessJob.from_dict(payload)
    with job_span(job.traceparent, "preprocess", {"dayzero.attachment_id": job.attachment_id}) as span:
        config = PreprocessConfig.from_dict(dict(job.config))
        store = _store(job.blob_url)
        blob_sha = job.blob_sha256
        data = store.get(blob_sha)
        cache = ProcessedCache(store)
        metrics.PREPROCESS_BYTES.inc(len(data))
        span.set_attribute("dayzero.preprocess.input_bytes", len(data))
        if job.media_type == PDF_MEDIA_TYPE:
            from preprocess.pdf import process_document

            doc = process_document(cache, data, config, source_sha256=blob_sha)
            return {"attachment_id": job.attachment_id, **doc}
        result = cache.process(data, config, source_sha256=blob_sha)
        image = result.image
        h, w = image.source_size
        red = image.redaction
        span.set_attributes(
            {
                "dayzero.preprocess.pixels": h * w,
                "dayzero.preprocess.patches": image.num_patches,
                "dayzero.preprocess.cache_hit": result.cache_hit,
                "dayzero.preprocess.redactions": red.faces + red.documents,
            }
        )
        metrics.PREPROCESS_PIXELS.inc(h * w)
        metrics.PREPROCESS_IMAGES.labels("hit" if result.cache_hit else "miss").inc()
        metrics.PREPROCESS_REDACTIONS.labels("face").inc(red.faces)
        metrics.PREPROCESS_REDACTIONS.labels("document").inc(red.documents)
        return {"attachment_id": job.attachment_id, **describe(result)}


def describe_error(exc: BaseException) -> dict[str, Any]:
    """JSON description of a job failure: image errors are permanent and say what to do."""
    from preprocess import ImageError

    if isinstance(exc, ImageError):
        return exc.to_dict()
    return {
        "type": type(exc).__name__,
        "code": "internal_error" if not isinstance(exc, (ValueError, KeyError)) else "bad_request",
        "message": str(exc),
        "details": {},
        "retryable": not isinstance(exc, (ValueError, KeyError)),
    }


from workers.tool_jobs import run_tool  # noqa: E402,F401  (the `dayzero.run_tool` Celery task calls it)

"""`workers.jobs`: plain functions, JSON in and out, typed errors, idempotent."""

from __future__ import annotations

import json

import pytest

from preprocess import BlobNotFoundError, BlobStore, NotAnImageError, ProcessedImage
from workers import jobs


def test_preprocess_attachment(image_blob):
    url, sha = image_blob
    payload = {
        "attachment_id": "a-1",
        "blob_sha256": sha,
        "blob_url": url,
        "config": {"redact_documents": True},
    }
    out = jobs.preprocess_attachment(payload)
    assert json.loads(json.dumps(out)) == out
    keys = {"attachment_id", "content_hash", "grid_thw", "processed_sha256", "redaction", "redacted_sha256"}
    assert set(out) == keys
    # with redaction on, the redacted image (what a bytes-only model server is sent) is stored too
    redacted = BlobStore(url).get(out["redacted_sha256"])
    assert redacted.startswith(b"\x89PNG")
    assert out["grid_thw"] == [[1, 36, 46]]  # 640x480 -> padded 644x504 -> 46x36 patches
    assert out["redaction"]["enabled"] is True and out["redaction"]["documents"] == 0
    processed = ProcessedImage.from_bytes(BlobStore(url).get(out["processed_sha256"]))
    assert processed.pixel_values.shape == (36 * 46, 3, 14, 14)
    assert jobs.preprocess_attachment(payload) == out  # idempotent: same blob + settings, same result


def test_config_defaults_when_absent(image_blob):
    url, sha = image_blob
    out = jobs.preprocess_attachment({"attachment_id": "a", "blob_sha256": sha, "blob_url": url})
    assert out["redaction"]["enabled"] is False and out["redacted_sha256"] is None


def test_image_error_is_typed_and_described(tmp_path):
    url = str(tmp_path)
    sha = BlobStore(url).put(b"GIF? no. plain text in a .gif")
    with pytest.raises(NotAnImageError) as info:
        jobs.preprocess_attachment({"attachment_id": "a", "blob_sha256": sha, "blob_url": url, "config": {}})
    desc = jobs.describe_error(info.value)
    assert json.loads(json.dumps(desc)) == desc
    assert desc["code"] == "not_an_image" and desc["retryable"] is False


@pytest.mark.parametrize(
    ("change", "exc"),
    [
        ({"attachment_id": ""}, ValueError),
        ({"config": {"no_such_setting": 1}}, ValueError),
        ({"blob_sha256": "0" * 64}, BlobNotFoundError),
    ],
    ids=["missing-id", "unknown-setting", "missing-blob"],
)
def test_bad_payloads(image_blob, change, exc):
    url, sha = image_blob
    payload = {"attachment_id": "a", "blob_sha256": sha, "blob_url": url, "config": {}, **change}
    with pytest.raises(exc) as info:
        jobs.preprocess_attachment(payload)
    desc = jobs.describe_error(info.value)
    assert desc["code"] == "bad_request" and desc["retryable"] is False


def test_concurrent_calls_in_threads_agree(image_blob):
    """The embedded dispatcher runs jobs on a thread pool: racing calls on one blob all succeed
    with the same result (atomic blob writes; same content, same name)."""
    from concurrent.futures import ThreadPoolExecutor

    url, sha = image_blob
    payloads = [
        {
            "attachment_id": f"t{i}",
            "blob_sha256": sha,
            "blob_url": url,
            "config": {"redact_documents": i % 2 == 0},
        }
        for i in range(6)
    ]
    with ThreadPoolExecutor(max_workers=4) as pool:
        outs = list(pool.map(jobs.preprocess_attachment, payloads))
    for config_parity in (0, 1):
        group = [o for i, o in enumerate(outs) if i % 2 == config_parity]
        assert len({(o["content_hash"], o["processed_sha256"]) for o in group}) == 1
    assert outs[0]["content_hash"] != outs[1]["content_hash"]  # redaction setting is part of the name

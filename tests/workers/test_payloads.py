"""The typed job payloads survive the JSON trip the Celery path gives them."""

from __future__ import annotations

import json

import pytest

from core.payloads import AttachmentRef, PreprocessJob, ToolJob


def test_tool_job_round_trips_through_json():
    job = ToolJob(
        tool="echo",
        arguments='{"a": 1}',
        task_id="t",
        step_index=3,
        attempt=2,
        idempotency_key="t:3:2",
        timeout_s=5.0,
        workspace="/ws/t",
        attachments=(AttachmentRef(id="a1", media_type="image/png", path="/b/x", content_hash="h"),),
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
        runner_id="r1",
        not_after=123.5,
    )
    assert ToolJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job


def test_preprocess_job_round_trips_and_names_what_is_missing():
    job = PreprocessJob("a1", "f" * 64, "/blobs", "image/png", {"redact_faces": True}, None)
    assert PreprocessJob.from_dict(json.loads(json.dumps(job.to_dict()))) == job
    with pytest.raises(ValueError, match="blob_url"):
        PreprocessJob.from_dict({"attachment_id": "a", "blob_sha256": "s"})


def test_malformed_tool_job_is_rejected():
    with pytest.raises(TypeError):
        ToolJob.from_dict({"tool": 3, "task_id": "t", "step_index": 0, "attempt": 1, "idempotency_key": "k"})
    with pytest.raises(KeyError):
        ToolJob.from_dict({"tool": "echo"})

"""The preprocess job through a real Celery worker process and real Redis."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
from opentelemetry import context, trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from preprocess import BlobStore, NotAnImageError, ProcessedImage
from testing.celery_test_app import build_app
from tests.workers.conftest import REDIS_URL, REPO, kill_group
from workers.celery_app import make_celery_app

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


@pytest.fixture
def running(worker_env):
    app = build_app(REDIS_URL, REDIS_URL, worker_env.prefix)
    proc = worker_env.start_worker(pool="prefork", name="e2e")
    try:
        yield app
    finally:
        kill_group(proc)
        app.close()


def test_preprocess_job_through_worker(running, image_blob):
    app = running
    url, sha = image_blob
    payload = {"attachment_id": "att-1", "blob_sha256": sha, "blob_url": url, "config": {"max_patches": 256}}
    res = app.send_task("dayzero.preprocess_attachment", args=[payload])
    out = res.get(timeout=30)
    keys = {"attachment_id", "content_hash", "grid_thw", "processed_sha256", "redaction", "redacted_sha256"}
    assert set(out) == keys
    assert out["attachment_id"] == "att-1" and out["redacted_sha256"] is None  # redaction off
    processed = ProcessedImage.from_bytes(BlobStore(url).get(out["processed_sha256"]))
    assert processed.content_hash == out["content_hash"]
    assert out["grid_thw"] == processed.grid_list() and processed.num_patches <= 256 + 64
    json.dumps(out)

    # A bad image is a typed, permanent failure on the caller's side, rebuilt from JSON.
    bad_sha = BlobStore(url).put(b"this is not a picture, despite the .png name")
    bad = app.send_task(
        "dayzero.preprocess_attachment",
        args=[{"attachment_id": "att-2", "blob_sha256": bad_sha, "blob_url": url, "config": {}}],
    )
    with pytest.raises(NotAnImageError) as info:
        bad.get(timeout=30)
    assert "not an image" in str(info.value)
    assert bad.state == "FAILURE"


def test_trace_context_crosses_the_queue(running):
    app = running
    # Explicit header, as a caller without an OpenTelemetry SDK would set it.
    got = app.send_task(
        "dayzero_test.traceparent", queue="preprocess", headers={"traceparent": TRACEPARENT}
    ).get(timeout=30)
    # the job runs in the worker's consumer span: same trace, a span of its own
    assert got.split("-")[1] == TRACEPARENT.split("-")[1] and got != TRACEPARENT
    # Implicit: the publisher's current span context is injected by the before_task_publish hook.
    ctx = TraceContextTextMapPropagator().extract({"traceparent": TRACEPARENT})
    token = context.attach(ctx)
    try:
        assert trace.get_current_span().get_span_context().is_valid
        got = app.send_task("dayzero_test.traceparent", queue="preprocess").get(timeout=30)
    finally:
        context.detach(token)
    assert got.split("-")[1] == TRACEPARENT.split("-")[1]
    # No context: nothing is invented.
    assert app.send_task("dayzero_test.traceparent", queue="preprocess").get(timeout=30) is None


def test_dayzero_worker_command_runs_the_job(image_blob, tmp_path):
    """`dayzero worker --queues preprocess --concurrency 1` against Redis, on a database of its own
    (the CLI path has no key prefix, and must not eat other tests' messages)."""
    db = os.environ.get("DAYZERO_TEST_REDIS_CLI_DB", "13")
    broker = REDIS_URL.rsplit("/", 1)[0] + "/" + db
    log = tmp_path / "cli-worker.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CELERY_BROKER_URL": broker,
        "CELERY_RESULT_BACKEND": broker,
    }
    cmd = [sys.executable, "-m", "orchestrator.cli", "worker", "--queues", "preprocess", "--concurrency", "1",
           "--hostname", f"cli-{os.getpid()}@%h"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    app = make_celery_app(broker, broker)
    try:
        deadline = time.monotonic() + 60
        while b" ready." not in log.read_bytes():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[
                -3000:
            ]
            time.sleep(0.1)
        url, sha = image_blob
        out = app.send_task(
            "dayzero.preprocess_attachment",
            args=[{"attachment_id": "cli", "blob_sha256": sha, "blob_url": url, "config": {}}],
        ).get(timeout=30)
        assert out["attachment_id"] == "cli" and out["grid_thw"] == [[1, 36, 46]]
        assert "preprocess" in log.read_text(errors="replace")  # the queue it listens on
    finally:
        kill_group(proc)
        app.close()

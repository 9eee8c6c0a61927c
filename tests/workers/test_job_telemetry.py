"""Jobs are spans of the task's trace (parent: the Celery consumer span, or the payload's
traceparent on the in-process path) and count themselves in the worker metrics."""

from __future__ import annotations

from prometheus_client import REGISTRY

from preprocess import BlobStore
from testing.otel import span_exporter
from tools.config import ToolsConfig
from workers import jobs
from workers.tool_jobs import build_registry, run_tool

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = "b7ad6b7169203331"
TP = f"00-{TRACE}-{PARENT}-01"


def _v(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_preprocess_job_span_and_throughput_metrics(image_blob):
    spans = span_exporter()
    spans.clear()
    url, sha = image_blob
    size = len(BlobStore(url).get(sha))
    before = {
        "bytes": _v("dayzero_preprocess_input_bytes_total"),
        "pixels": _v("dayzero_preprocess_pixels_total"),
        "miss": _v("dayzero_preprocess_images_total", cache="miss"),
        "hit": _v("dayzero_preprocess_images_total", cache="hit"),
        "ok": _v("dayzero_worker_jobs_total", job="preprocess", outcome="ok"),
    }
    payload = {"attachment_id": "a1", "blob_sha256": sha, "blob_url": url, "config": {}, "traceparent": TP}
    jobs.preprocess_attachment(payload)
    jobs.preprocess_attachment(payload)  # the same image again: a processed-cache hit
    first, second = [s for s in spans.get_finished_spans() if s.name == "preprocess.execute"]
    assert f"{first.context.trace_id:032x}" == TRACE and f"{first.parent.span_id:016x}" == PARENT
    assert first.attributes["dayzero.preprocess.input_bytes"] == size
    assert first.attributes["dayzero.preprocess.pixels"] == 640 * 480
    assert first.attributes["dayzero.preprocess.cache_hit"] is False
    assert second.attributes["dayzero.preprocess.cache_hit"] is True
    assert first.attributes["dayzero.preprocess.redactions"] == 0
    assert _v("dayzero_preprocess_input_bytes_total") - before["bytes"] == 2 * size
    assert _v("dayzero_preprocess_pixels_total") - before["pixels"] == 2 * 640 * 480
    assert _v("dayzero_preprocess_images_total", cache="miss") - before["miss"] == 1
    assert _v("dayzero_preprocess_images_total", cache="hit") - before["hit"] == 1
    assert _v("dayzero_worker_jobs_total", job="preprocess", outcome="ok") - before["ok"] == 2


def test_tool_job_span_outcome_and_error(tmp_path, monkeypatch):
    monkeypatch.setenv("DAYZERO_TEST_STATE_DIR", str(tmp_path))
    spans = span_exporter()
    spans.clear()
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    errors_before = _v("dayzero_worker_jobs_total", job="tool", outcome="error")
    base = {"task_id": "t", "step_index": 1, "idempotency_key": "t:1:1", "timeout_s": 5, "traceparent": TP}
    assert run_tool({**base, "tool": "echo", "arguments": "{}", "attempt": 1}, registry)["ok"]
    assert not run_tool({**base, "tool": "broken", "arguments": "{}", "attempt": 2}, registry)["ok"]
    ok, bad = [s for s in spans.get_finished_spans() if s.name == "tool.execute"]
    assert ok.attributes["dayzero.tool"] == "echo" and ok.attributes["dayzero.tool.outcome"] == "ok"
    assert bad.attributes["dayzero.attempt"] == 2 and bad.attributes["dayzero.tool.outcome"] == "permanent"
    assert bad.status.status_code.name == "ERROR" and bad.attributes["error.type"] == "PermanentToolError"
    assert all(f"{s.parent.span_id:016x}" == PARENT for s in (ok, bad))
    assert _v("dayzero_worker_jobs_total", job="tool", outcome="error") - errors_before == 1


def test_queue_depth_is_read_from_the_broker(worker_env):
    from prometheus_client import CollectorRegistry

    from testing.celery_test_app import build_app
    from tests.workers.conftest import REDIS_URL
    from workers.metrics import QueueDepthCollector

    app = build_app(REDIS_URL, REDIS_URL, worker_env.prefix)  # its own key prefix: no worker listens
    registry = CollectorRegistry()
    registry.register(QueueDepthCollector(app, ["preprocess", "tools"]))
    try:
        assert registry.get_sample_value("dayzero_celery_queue_depth", {"queue": "tools"}) == 0
        for _ in range(3):
            app.send_task("dayzero.run_tool", args=[{}], queue="tools")
        assert registry.get_sample_value("dayzero_celery_queue_depth", {"queue": "tools"}) == 3
        assert registry.get_sample_value("dayzero_celery_queue_depth", {"queue": "preprocess"}) == 0
    finally:
        app.close()

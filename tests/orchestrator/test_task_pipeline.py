"""Tasks with image attachments: preprocessing stage, then the agent loop — in-process, and
through real Celery workers on Redis (queues `preprocess` and `tools`)."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
from PIL import Image

from orchestrator.attachments import add_attachment
from orchestrator.config import Budgets
from orchestrator.dispatch import CeleryDispatcher
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import NewTask, create_task, get_task, list_events, list_messages
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("DAYZERO_TEST_CELERY_URL", "redis://127.0.0.1:6379/5")


def _png(w: int, h: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (w, h), (120, 30, 200)).save(buf, "PNG")
    return buf.getvalue()


def _submit_with_images(db, blob_url: str, images: list[bytes], script: dict) -> tuple[str, list[str]]:
    with db.begin() as conn:
        ids = [
            add_attachment(conn, blob_url, "t1", data, "image/png", f"i{i}.png")
            for i, data in enumerate(images)
        ]
        task_id, _ = create_task(
            conn, NewTask(tenant="t1", goal="script:" + json.dumps(script), attachment_ids=ids), Budgets()
        )
    return task_id, ids


def _attachment_rows(db, task_id):
    from orchestrator.store import attachments_t

    with db.connect() as conn:
        return list(conn.execute(attachments_t.select().where(attachments_t.c.task_id == task_id)))


def test_image_task_is_preprocessed_then_runs(db, make_runner, tmp_path):
    blob_url = str(tmp_path / "blobs")
    task_id, ids = _submit_with_images(
        db, blob_url, [_png(100, 70), _png(64, 64)], {"cycles": 1, "tool": "whoami"}
    )
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "PREPROCESSING"
    make_runner(blob_url=blob_url).run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        events = [e.type for e in list_events(conn, task_id)]
        tool_msg = next(m for m in list_messages(conn, task_id) if m["role"] == "tool")
    assert task.status == "SUCCEEDED", task.error
    rows = _attachment_rows(db, task_id)
    assert {r.status for r in rows} == {"READY"}
    assert all(r.content_hash and r.processed_sha256 and r.grid_thw for r in rows)
    assert events[:4] == ["task.created", "task.preprocessing", "attachment.ready", "attachment.ready"]
    assert "task.ready" in events
    assert sorted(json.loads(tool_msg["content"])["attachments"]) == sorted(ids)  # tools see them


def test_corrupt_image_fails_the_task_with_a_clear_error(db, make_runner, tmp_path):
    blob_url = str(tmp_path / "blobs")
    truncated = _png(300, 200)[:200]
    task_id, ids = _submit_with_images(db, blob_url, [truncated], {"cycles": 1})
    make_runner(blob_url=blob_url).run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert task.status == "FAILED"
    assert task.error["kind"] == "attachment" and task.error["attachment"] == ids[0]
    assert task.error["retryable"] is False and task.error["message"]
    (row,) = _attachment_rows(db, task_id)
    assert row.status == "FAILED" and row.error["message"] == task.error["message"]


@pytest.fixture
def celery_worker(tmp_path):
    client = redis.Redis.from_url(REDIS_URL)
    client.flushdb()  # a database of its own: no stale messages from earlier runs
    log = tmp_path / "worker.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_RESULT_BACKEND": REDIS_URL,
        "DAYZERO_TOOL_MODULES": "testing.fixture_tools",
    }
    cmd = [
        sys.executable,
        "-m",
        "orchestrator.cli",
        "worker",
        "--queues",
        "preprocess,tools",
        "--pool",
        "solo",
    ]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    deadline = time.monotonic() + 90
    while b" ready." not in log.read_bytes():
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.1)
    yield proc
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    client.flushdb()


def test_image_task_through_celery_workers_on_redis(
    pg_url, model_server, celery_worker, tmp_path, monkeypatch
):
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    monkeypatch.setenv("DAYZERO_TEST_STATE_DIR", str(tmp_path / "state"))
    db = make_engine(pg_url)
    migrate.upgrade(db)
    blob_url = str(tmp_path / "blobs")
    task_id, _ = _submit_with_images(db, blob_url, [_png(90, 60)], {"cycles": 2, "tool": "whoami"})
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    dispatcher = CeleryDispatcher(REDIS_URL, REDIS_URL)
    client = OpenAIChatClient(model_server.url, "scripted")
    runner = Runner(
        db, client, dispatcher, registry, RunnerConfig(lease_s=10, poll_interval_s=0.05, blob_url=blob_url)
    )
    try:
        runner.run_until_idle(timeout_s=120)
    finally:
        dispatcher.close()
        client.close()
    with db.connect() as conn:
        task = get_task(conn, task_id)
        pids = {json.loads(m["content"])["pid"] for m in list_messages(conn, task_id) if m["role"] == "tool"}
    assert task.status == "SUCCEEDED", task.error
    assert pids == {celery_worker.pid}  # the tools ran in the worker process, not here
    assert {r.status for r in _attachment_rows(db, task_id)} == {"READY"}
    db.dispose()

"""At-least-once delivery with idempotent jobs: a worker killed mid-job loses nothing, and the job
completes exactly once.

Two ways to die: the whole worker (main process and pool) is SIGKILLed, so the message sits unacked
in Redis until the visibility timeout (3 s in this config) and a new worker gets it; or only the
pool child running the job is SIGKILLed, so the surviving main process rejects it back to the
queue (`task_reject_on_worker_lost`). The job pauses before doing its work (`slow_preprocess`) so
that the kill lands mid-task deterministically.
"""

from __future__ import annotations

import os
import signal
import time

from preprocess import BlobStore, ProcessedImage
from testing.celery_test_app import VISIBILITY_ENV, VISIBILITY_TIMEOUT_S, build_app
from tests.workers.conftest import REDIS_URL, kill_group, wait_for


def _send(app, url: str, sha: str, delay_s: float):
    payload = {"attachment_id": "att-kill", "blob_sha256": sha, "blob_url": url, "config": {}}
    return app.send_task("dayzero_test.slow_preprocess", args=[payload, delay_s], queue="preprocess")


def _check_result(out: dict, url: str) -> None:
    processed = ProcessedImage.from_bytes(BlobStore(url).get(out["processed_sha256"]))
    assert processed.content_hash == out["content_hash"] and out["attachment_id"] == "att-kill"


def test_whole_worker_sigkilled_mid_job(worker_env, image_blob):
    url, sha = image_blob
    app = build_app(REDIS_URL, REDIS_URL, worker_env.prefix)
    first = worker_env.start_worker(pool="prefork", name="first")
    second = None
    try:
        res = _send(app, url, sha, delay_s=4.0)
        wait_for(lambda: worker_env.counter("started") == 1, 30, "the job to start")
        kill_group(first)  # SIGKILL to the main process and its pool child at once
        assert worker_env.counter("completed") == 0
        second = worker_env.start_worker(pool="solo", name="second")
        out = res.get(timeout=60)
        _check_result(out, url)
        assert worker_env.counter("started") == 2 and worker_env.counter("completed") == 1
        # Nothing else comes back later: one completion, no duplicate delivery.
        time.sleep(VISIBILITY_TIMEOUT_S + 2)
        assert worker_env.counter("started") == 2 and worker_env.counter("completed") == 1
        assert worker_env.redis.zcard(worker_env.prefix + "unacked_index") == 0
    finally:
        kill_group(first)
        if second is not None:
            kill_group(second)
        app.close()


def test_pool_child_sigkilled_mid_job(worker_env, image_blob):
    url, sha = image_blob
    app = build_app(REDIS_URL, REDIS_URL, worker_env.prefix)
    # the redelivery here is the surviving main process's reject, not the visibility timeout: a
    # long one, so that the redelivered run's ack (after a fresh pool child has started, which
    # under load took past 3 s) never races it into a third, at-least-once start (it did twice)
    worker = worker_env.start_worker(pool="prefork", name="child", extra_env={VISIBILITY_ENV: "60"})
    try:
        res = _send(app, url, sha, delay_s=VISIBILITY_TIMEOUT_S / 2)
        wait_for(lambda: worker_env.counter("started") == 1, 30, "the job to start")
        child_pid = int(worker_env.redis.lindex(worker_env.prefix + "pids", 0))
        assert child_pid != worker.pid
        os.kill(child_pid, signal.SIGKILL)
        out = res.get(timeout=60)
        _check_result(out, url)
        assert res.state == "SUCCESS"
        assert worker_env.counter("started") == 2 and worker_env.counter("completed") == 1
        pids = [int(p) for p in worker_env.redis.lrange(worker_env.prefix + "pids", 0, -1)]
        assert pids[1] != child_pid  # ran again in a fresh pool process
    finally:
        kill_group(worker)
        app.close()

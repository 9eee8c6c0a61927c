"""The job liveness keys and the runner's judgement of them (`workers.liveness`), on the real Redis."""

from __future__ import annotations

import time
import uuid

from testing.celery_test_app import build_app
from tests.workers.conftest import REDIS_URL
from workers.liveness import JobWatch, alive_key, heartbeat, started_key


def test_a_running_job_is_alive_and_leaves_only_an_expiring_key(worker_env):
    app = build_app(REDIS_URL, REDIS_URL, worker_env.prefix)
    job = uuid.uuid4().hex
    watch = JobWatch(app, job, lost_after_s=0.2)
    assert not watch.lost()  # not started yet: queued, never lost
    with heartbeat(app, job, started_ttl_s=60):
        deadline = time.monotonic() + 5
        while worker_env.redis.get(alive_key(job)) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert worker_env.redis.get(started_key(job)) is not None
        assert not watch.lost()
    assert worker_env.redis.get(started_key(job)) is None  # deleted at the end
    assert 0 < worker_env.redis.pttl(alive_key(job)) <= 3000  # expires by itself
    worker_env.redis.delete(alive_key(job))


def test_a_started_job_whose_key_stays_missing_is_lost_but_a_redis_outage_never_counts(worker_env):
    app = build_app(REDIS_URL, REDIS_URL, worker_env.prefix)
    job = uuid.uuid4().hex
    worker_env.redis.set(started_key(job), 1, ex=60)  # its worker died after starting it
    try:
        watch = JobWatch(app, job, lost_after_s=0.2)
        assert not watch.lost()  # the absence starts counting
        time.sleep(0.3)
        real = watch.client
        watch.client = _Down()
        assert not watch.lost()  # unreadable: no judgement, and the count starts again
        watch.client = real
        assert not watch.lost()
        time.sleep(0.3)
        assert watch.lost()
    finally:
        worker_env.redis.delete(started_key(job))


class _Down:
    def mget(self, *keys: str) -> list[bytes | None]:
        raise ConnectionError("Redis is away")

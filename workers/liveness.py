"""Liveness of a running tool job: a runner waiting for it notices a dead worker in seconds.

While a `dayzero.run_tool` job runs, a thread of the worker process running it refreshes two keys
in the Redis result backend every `BEAT_S`: `dayzero-job-started:<celery id>` (deleted when the
job ends; it outlives a dead worker for the job's hard limit) and `dayzero-job-alive:<celery id>`
(expires after `ALIVE_TTL_S`). The runner waiting for the job (`JobWatch`, in
`orchestrator.dispatch`) declares the worker lost once the job has started and its alive key has
been missing over `LOST_AFTER_S` of successful reads: the attempt fails retryable with its
outcome unknown (`worker_lost`), and the orchestrator's retry policy takes it from there,
instead of waiting out the tool's whole timeout.

Why this is needed: with `task_acks_late` and `task_reject_on_worker_lost`, a pool child that dies
is rejected back to the queue by its surviving main process, but a whole worker that is SIGKILLed
leaves its message unacked, and Redis redelivers it only after the visibility timeout (over an
hour). `LOST_AFTER_S` is longer than a requeued job takes to start again on another pool child
(the alive key then comes back under the same id), and reads that fail (a Redis outage) restart
the count rather than add to it. A result backend other than Redis has no watch (on RabbitMQ the
broker redelivers as soon as the dead worker's connection drops).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

log = logging.getLogger(__name__)

BEAT_S = 1.0
ALIVE_TTL_S = 3.0
LOST_AFTER_S = 5.0


def started_key(job_id: str) -> str:
    return f"dayzero-job-started:{job_id}"


def alive_key(job_id: str) -> str:
    return f"dayzero-job-alive:{job_id}"


def _redis_of(app: Any) -> Any:
    """The Redis client of the app's result backend, or None for another backend."""
    from celery.backends.redis import RedisBackend

    backend = app.backend
    return backend.client if isinstance(backend, RedisBackend) else None


@contextlib.contextmanager
def heartbeat(app: Any, job_id: str | None, *, started_ttl_s: int) -> Iterator[None]:
    """Keep the job's keys fresh while the body runs (a no-op without a Redis result backend);
    the started key lasts `started_ttl_s`, as long as the job may."""
    client = _redis_of(app) if job_id else None
    if client is None or job_id is None:
        yield
        return
    stop = threading.Event()

    def beat() -> None:
        while True:
            try:
                pipe = client.pipeline(transaction=False)
                pipe.set(started_key(job_id), 1, ex=started_ttl_s)
                pipe.set(alive_key(job_id), 1, px=int(ALIVE_TTL_S * 1000))
                pipe.execute()
            except Exception as exc:  # Redis away: the runner's reads fail too and do not count
                log.debug("job %s heartbeat failed: %s", job_id, exc)
            if stop.wait(BEAT_S):
                return

    thread = threading.Thread(target=beat, name=f"dayzero-beat-{job_id[:8]}", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=0.5)
        # The started key goes (one per job would pile up for an hour); the alive key expires by
        # itself, after the result is stored, so the waiting runner never sees the job vanish.
        with contextlib.suppress(Exception):
            client.delete(started_key(job_id))


class JobWatch:
    """The runner's side: `lost()` is True once the job's worker is known to be gone."""

    def __init__(self, app: Any, job_id: str, *, lost_after_s: float = LOST_AFTER_S):
        self.client = _redis_of(app)
        self.job_id = job_id
        self.lost_after_s = lost_after_s
        self._seen = False
        self._missing_since: float | None = None

    def lost(self) -> bool:
        if self.client is None:
            return False
        try:
            started, alive = self.client.mget(started_key(self.job_id), alive_key(self.job_id))
        except Exception:  # no judgement while Redis is away; the count starts again after it
            self._missing_since = None
            return False
        now = time.monotonic()
        if alive is not None:
            self._seen, self._missing_since = True, None
            return False
        if not (self._seen or started is not None):
            return False  # still queued: not started by any worker yet
        if self._missing_since is None:
            self._missing_since = now
        return now - self._missing_since >= self.lost_after_s

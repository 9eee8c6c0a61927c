"""Celery app for the worker tests: the real `make_celery_app`, isolated by a Redis key prefix,
with a short visibility timeout, plus two test-only tasks.

`celery -A testing.celery_test_app worker` reads DZ_TEST_PREFIX, CELERY_BROKER_URL and
CELERY_RESULT_BACKEND from the environment; the test process calls `build_app` with the same values.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery

from workers import jobs
from workers.celery_app import make_celery_app
from workers.telemetry import current_traceparent

VISIBILITY_TIMEOUT_S = 3.0
# a worker started with this set uses it instead (a test whose redelivery is not the timeout's)
VISIBILITY_ENV = "DZ_TEST_VISIBILITY_TIMEOUT_S"


def build_app(broker_url: str, result_backend: str, prefix: str) -> Celery:
    app = make_celery_app(
        broker_url,
        result_backend,
        visibility_timeout_s=float(os.environ.get(VISIBILITY_ENV, VISIBILITY_TIMEOUT_S)),
        # Sweep for abandoned messages every second instead of every 100 s.
        broker_transport_options={
            "global_keyprefix": prefix,
            "unacked_restore_interval": 1,
            "unacked_restore_throttle": 1,
        },
    )
    counters = redis.Redis.from_url(broker_url)

    @app.task(name="dayzero_test.slow_preprocess", shared=False)
    def slow_preprocess(payload: dict[str, Any], delay_s: float) -> dict[str, Any]:
        """The real preprocess job with a pause first, so a test can kill the worker mid-task."""
        counters.incr(prefix + "started")
        counters.rpush(prefix + "pids", os.getpid())
        time.sleep(delay_s)
        out = jobs.preprocess_attachment(payload)
        counters.incr(prefix + "completed")
        return out

    @app.task(name="dayzero_test.traceparent", shared=False)
    def traceparent() -> str | None:
        return current_traceparent()

    return app


if "DZ_TEST_PREFIX" in os.environ:
    app = build_app(
        os.environ["CELERY_BROKER_URL"], os.environ["CELERY_RESULT_BACKEND"], os.environ["DZ_TEST_PREFIX"]
    )

"""Prometheus metrics of the orchestrator processes (API, ingest, relay, runner), one registry per
process. Names follow the Prometheus conventions (`_total` counters, `_seconds` histograms, base
units); docs/observability.md lists every one with its labels and the process that serves it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

# -- ingress (API) -------------------------------------------------------------------------------
HTTP_REQUESTS = Counter(
    "dayzero_http_requests_total", "HTTP requests by route and status", ["method", "route", "status"]
)
HTTP_LATENCY = Histogram(
    "dayzero_http_request_seconds",
    "HTTP request latency (until the response starts)",
    ["method", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5),
)
HTTP_SHED = Counter("dayzero_http_shed_total", "requests answered 503 at once: too many in flight")
TASKS_SUBMITTED = Counter(
    "dayzero_tasks_submitted_total", "task submissions by source and outcome", ["source", "outcome"]
)
SSE_STREAMS = Gauge("dayzero_sse_streams", "open SSE event streams")

# -- Kafka ingest and the outbox relay -----------------------------------------------------------
INGEST_MESSAGES = Counter(
    "dayzero_ingest_messages_total", "Kafka task messages by outcome (created, duplicate, dlq)", ["outcome"]
)
INGEST_BATCH_SECONDS = Histogram("dayzero_ingest_batch_seconds", "DB time per ingest batch")
INGEST_PAUSED = Gauge("dayzero_ingest_paused", "1 while ingest pauses its partitions (back-pressure)")
RELAY_PUBLISHED = Counter("dayzero_relay_published_total", "outbox events published", ["topic"])
RELAY_LAG = Gauge("dayzero_relay_unpublished", "outbox events not yet published (last batch)")

# -- runner ----------------------------------------------------------------------------------------
_STEP_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
STEP_SECONDS = Histogram(
    "dayzero_step_duration_seconds",
    "one step attempt, from its start to its committed outcome",
    ["kind", "outcome"],
    buckets=_STEP_BUCKETS,
)
TOOL_ATTEMPTS = Counter(
    "dayzero_tool_attempts_total", "tool attempts by tool and outcome", ["tool", "outcome"]
)
STEP_RETRIES = Counter("dayzero_step_retries_total", "step retries scheduled", ["kind"])
MODEL_TOKENS = Counter(
    "dayzero_model_tokens_total", "model tokens by type (prompt, cached, completion)", ["type"]
)
MODEL_TTFT = Histogram(
    "dayzero_model_time_to_first_token_seconds",
    "time to first token of a model step, as the inference server reports it",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
TASKS_FINISHED = Counter("dayzero_tasks_finished_total", "tasks that reached a final state", ["status"])
INFERENCE_WIRE = Counter(
    "dayzero_inference_requests_by_form_total",
    "chat requests by wire form: incremental (only new messages), or full:<why>",
    ["form"],
)
INFERENCE_REQUEST_BYTES = Counter(
    "dayzero_inference_request_bytes_total", "bytes of chat request bodies sent", ["form"]
)
LEASES_LOST = Counter("dayzero_runner_leases_lost_total", "task leases this runner lost (expired, taken)")
ATTEMPTS_RESUMED = Counter(
    "dayzero_runner_attempts_resumed_total",
    "in-doubt attempts taken over after another runner's lease expired",
)
PREPROCESS_JOBS = Counter(
    "dayzero_preprocess_jobs_total", "attachment preprocess jobs the runner waited for", ["outcome"]
)


class TaskStateCollector(Collector):
    """`dayzero_tasks{state}` and `dayzero_tasks_runnable` read from the database at scrape time
    (a gauge kept in one process would miss every other writer)."""

    def __init__(self) -> None:
        self.engine: Any = None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from sqlalchemy import func, select
        from sqlalchemy.exc import SQLAlchemyError

        from orchestrator.clock import utcnow
        from orchestrator.db.tables import tasks_t
        from orchestrator.statemachine import TaskStatus

        by_state = GaugeMetricFamily("dayzero_tasks", "tasks by state", labels=["state"])
        runnable = GaugeMetricFamily(
            "dayzero_tasks_runnable", "tasks a runner may claim now (the runners' queue depth)"
        )
        if self.engine is None:
            return
        try:
            with self.engine.connect() as conn:
                counts = dict(
                    conn.execute(select(tasks_t.c.status, func.count()).group_by(tasks_t.c.status)).all()
                )
                ready = conn.execute(
                    select(func.count()).where(
                        tasks_t.c.status.in_([TaskStatus.READY.value, TaskStatus.WAITING.value]),
                        tasks_t.c.next_run_at <= utcnow(),
                    )
                ).scalar_one()
        except SQLAlchemyError:  # the database is down: /metrics still answers (readyz says why)
            log.warning("task state gauges skipped: database unavailable", exc_info=True)
            return
        for state in TaskStatus:
            by_state.add_metric([state.value], counts.get(state.value, 0))
        runnable.add_metric([], ready)
        yield by_state
        yield runnable


_TASK_STATES = TaskStateCollector()


def register_task_states(engine: Any) -> None:
    """Serve the DB-backed task gauges from this process's registry, read through `engine` (the
    API does this; the latest app's engine wins, as tests build several apps in one process)."""
    if _TASK_STATES.engine is None:
        REGISTRY.register(_TASK_STATES)
    _TASK_STATES.engine = engine


def render() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST

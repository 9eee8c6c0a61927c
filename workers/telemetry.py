"""The span and metrics of one job (tool or preprocess) in a worker or the in-process dispatcher.

The SDK set-up and the trace-context helpers are `core.telemetry`'s (re-exported here for the
callers that import them from this module).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

from core.telemetry import (  # noqa: F401 (re-exported)
    current_traceparent,
    export_endpoint_configured,
    install_tracer_provider,
    mark_error,
)

_tracer = trace.get_tracer("dayzero.workers")


class Job:
    """The span of one job and the outcome its metrics are labelled with."""

    def __init__(self, span: Any):
        self.span = span
        self.outcome = "ok"

    def set_attribute(self, key: str, value: Any) -> None:
        self.span.set_attribute(key, value)

    def set_attributes(self, attrs: Mapping[str, Any]) -> None:
        self.span.set_attributes(dict(attrs))

    def fail(self, error_type: str, message: str) -> None:
        self.outcome = "error"
        mark_error(self.span, error_type, message)


@contextmanager
def job_span(traceparent: str | None, job: str, attributes: Mapping[str, Any]) -> Iterator[Job]:
    """The span and metrics of one job (`tool` or `preprocess`). Its parent is the current context
    (the Celery consumer span), or else the payload's `traceparent` (the in-process dispatcher's
    threads do not inherit the caller's context)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    from workers import metrics

    parent = None
    if not trace.get_current_span().get_span_context().is_valid and traceparent:
        parent = TraceContextTextMapPropagator().extract({"traceparent": str(traceparent)})
    t0 = time.perf_counter()
    j = Job(None)
    try:
        with _tracer.start_as_current_span(
            f"{job}.execute", context=parent, attributes=dict(attributes)
        ) as span:
            j.span = span
            yield j
    except BaseException:
        j.outcome = "error"
        raise
    finally:
        metrics.JOBS.labels(job, j.outcome).inc()
        metrics.JOB_SECONDS.labels(job).observe(time.perf_counter() - t0)

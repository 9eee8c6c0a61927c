"""OpenTelemetry: one trace per task.

A task's trace context (W3C `traceparent`) is fixed when it is created — the span of the API
request or of the Kafka record's ingest, itself a child of the submitter's context when one came
with the request (HTTP header, Kafka record header) — and stored on the task row. Every span the
runner makes for the task is a child of it, and the context rides on to the model server (HTTP
header), the workers (Celery headers) and the published events and results (Kafka headers), so a
task's whole life is one trace.

Export is configured by the standard variables: `OTEL_EXPORTER_OTLP_ENDPOINT` (or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) turns on OTLP/HTTP export, `OTEL_SERVICE_NAME` and
`OTEL_RESOURCE_ATTRIBUTES` name the process, `OTEL_BSP_*` tune batching, `OTEL_SDK_DISABLED=true`
turns the SDK off. Without an endpoint spans are still made (and their context propagated).
"""

from __future__ import annotations

import functools
import re
import secrets
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from workers.telemetry import current_traceparent, install_tracer_provider
from workers.telemetry import mark_error as trace_error  # noqa: F401 (re-exported)

_PROPAGATOR = TraceContextTextMapPropagator()
TRACEPARENT_RE = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
tracer = trace.get_tracer("dayzero.orchestrator")


def new_traceparent() -> str:
    """A fresh sampled W3C traceparent (new trace id, new parent span id)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def valid_traceparent(value: str | None) -> str | None:
    return value if value and TRACEPARENT_RE.match(value) else None


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32-hex trace id of a valid traceparent (what trace UIs look traces up by)."""
    tp = valid_traceparent(traceparent)
    return tp.split("-")[1] if tp else None


def context_of(traceparent: str | None) -> otel_context.Context:
    """The context a span of a task starts in: the current span's when there is one (the HTTP
    server span FastAPI made from the request's header, an enclosing runner span), else the
    task's stored `traceparent` (a runner's step, the relay's publish of a task's event)."""
    if trace.get_current_span().get_span_context().is_valid:
        return otel_context.get_current()
    ctx = _stored_context(traceparent) if traceparent else None
    return ctx if ctx is not None else otel_context.get_current()


@functools.lru_cache(maxsize=1024)
def _stored_context(traceparent: str) -> otel_context.Context | None:
    """A stored traceparent parsed once, not at each of a task's spans (contexts are immutable)."""
    tp = valid_traceparent(traceparent)
    return _PROPAGATOR.extract({"traceparent": tp}) if tp else None


def kafka_headers(traceparent: str | None = None) -> list[tuple[str, bytes]]:
    """Record headers carrying the current span's context (or `traceparent` outside any span)."""
    tp = current_traceparent() or valid_traceparent(traceparent)
    return [("traceparent", tp.encode())] if tp else []


@contextmanager
def task_span(
    traceparent: str | None,
    name: str,
    attributes: Mapping[str, Any] | None = None,
    *,
    kind: SpanKind = SpanKind.INTERNAL,
) -> Iterator[Any]:
    """A span that is a child of the task's trace context, current while the block runs."""
    with tracer.start_as_current_span(
        name, context=context_of(traceparent), kind=kind, attributes=dict(attributes or {})
    ) as span:
        yield span


def record_transition(
    entity: str, task_id: str, old: str, new: str, traceparent: str | None, **attrs: Any
) -> None:
    """A state transition as a (zero-length) span, so trace views show when a task or step changed
    state: a child of the current span, or else of the task's own context."""
    now = time.time_ns()
    span = tracer.start_span(
        f"{entity}.transition",
        context=context_of(traceparent),
        start_time=now,
        attributes={
            "dayzero.task_id": task_id,
            "dayzero.entity": entity,
            "dayzero.from": old,
            "dayzero.to": new,
            **attrs,
        },
    )
    span.end(end_time=now)


def setup_tracing(service_name: str, otlp_endpoint: str | None = None) -> None:
    """Install the SDK tracer provider once per process (see the module docstring for the
    variables). `service_name` is the default when `OTEL_SERVICE_NAME` is unset; an explicit
    `otlp_endpoint` (the settings' copy of `OTEL_EXPORTER_OTLP_ENDPOINT`) turns export on."""
    install_tracer_provider(service_name, otlp_endpoint)

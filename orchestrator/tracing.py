"""OpenTelemetry: one trace per task.

A task's trace context (W3C `traceparent`) is fixed when it is created — taken from the submitter
(HTTP header, Kafka header) or minted here — and stored on the task row. Every span the runner
makes for the task is a child of it, and the context rides on to the model server (HTTP
header) and the workers (Celery headers), so a task's whole life is one trace.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

_PROPAGATOR = TraceContextTextMapPropagator()
TRACEPARENT_RE = re.compile(r"^00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$")
tracer = trace.get_tracer("dayzero.orchestrator")


def new_traceparent() -> str:
    """A fresh sampled W3C traceparent (new trace id, new parent span id)."""
    return f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"


def valid_traceparent(value: str | None) -> str | None:
    return value if value and TRACEPARENT_RE.match(value) else None


def current_traceparent() -> str | None:
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


@contextmanager
def task_span(
    traceparent: str | None, name: str, attributes: Mapping[str, Any] | None = None
) -> Iterator[Any]:
    """A span that is a child of the task's trace context, current while the block runs."""
    parent = _PROPAGATOR.extract({"traceparent": traceparent}) if traceparent else otel_context.get_current()
    with tracer.start_as_current_span(name, context=parent, attributes=dict(attributes or {})) as span:
        yield span


_installed = False


def setup_tracing(service_name: str, otlp_endpoint: str | None) -> None:
    """Install the SDK tracer provider once per process; export over OTLP/HTTP when an endpoint is
    configured. Without an endpoint spans are still created (and their context propagated), just
    not exported."""
    global _installed
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    if _installed or isinstance(trace.get_tracer_provider(), TracerProvider):
        return  # one provider per process (OpenTelemetry refuses a second)
    _installed = True
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service_name}))
    if otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(
            BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint.rstrip("/") + "/v1/traces"))
        )
    trace.set_tracer_provider(provider)

"""The OpenTelemetry SDK set-up of the orchestrator and worker processes (one decision, here).

`workers` holds it because both the orchestrator (which may import `workers`) and the Celery
workers (which may not import `orchestrator`) need it; the inference server, a leaf library,
has its own three-line copy in `inference.server.telemetry`.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from opentelemetry import trace

_installed = False
_tracer = trace.get_tracer("dayzero.workers")


def current_traceparent() -> str | None:
    """The W3C traceparent of the current context (None when there is no valid span)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def export_endpoint_configured(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def install_tracer_provider(service_name: str, otlp_endpoint: str | None = None) -> bool:
    """Install the SDK provider once per process; export over OTLP/HTTP when an endpoint is
    configured (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, read by the exporter itself, or
    `otlp_endpoint`). `OTEL_SERVICE_NAME` wins over `service_name`. Returns whether it installed."""
    global _installed
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    if _installed or isinstance(trace.get_tracer_provider(), TracerProvider):
        return False  # one provider per process (OpenTelemetry refuses a second)
    if os.environ.get("OTEL_SDK_DISABLED", "").lower() == "true":
        return False
    _installed = True
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # Resource.create reads OTEL_SERVICE_NAME / OTEL_RESOURCE_ATTRIBUTES over these defaults.
    name = os.environ.get("OTEL_SERVICE_NAME") or service_name
    provider = TracerProvider(resource=Resource.create({"service.name": name}))
    if export_endpoint_configured() or otlp_endpoint:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        exporter = (
            OTLPSpanExporter()
            if export_endpoint_configured()
            else OTLPSpanExporter(endpoint=str(otlp_endpoint).rstrip("/") + "/v1/traces")
        )
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def mark_error(span: Any, error_type: str, message: str) -> None:
    """Mark `span` failed the semantic-convention way (`error.type` and an ERROR status)."""
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", error_type)
    span.set_status(Status(StatusCode.ERROR, message[:500]))


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

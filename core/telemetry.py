"""The OpenTelemetry SDK set-up of every process (the API, runners, ingest, relay, Celery workers,
the inference server) and the trace-context helpers they share: one decision, here.

A process installs one tracer provider: spans are exported over OTLP/HTTP when an endpoint is
configured (`OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT`, read by the exporter itself, or the caller's
`otlp_endpoint`); `OTEL_SERVICE_NAME` wins over the caller's service name; `OTEL_SDK_DISABLED=true`
installs nothing. Without an endpoint the provider still makes real spans (trace ids in logs,
`traceparent` propagation), exported nowhere.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from opentelemetry import trace

_installed = False


def current_traceparent() -> str | None:
    """The W3C traceparent of the current context (None when there is no valid span)."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    return carrier.get("traceparent")


def export_endpoint_configured(env: Mapping[str, str] = os.environ) -> bool:
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def install_tracer_provider(service_name: str, otlp_endpoint: str | None = None) -> bool:
    """Install the SDK provider once per process (see the module docstring). Returns whether it
    installed one; a process that already has a provider keeps it (OpenTelemetry refuses a second)."""
    global _installed
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider

    if _installed or isinstance(trace.get_tracer_provider(), TracerProvider):
        return False
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

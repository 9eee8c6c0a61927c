"""Span capture for tests: one in-memory exporter on this process's (single) tracer provider."""

from __future__ import annotations

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

_EXPORTER: InMemorySpanExporter | None = None


def span_exporter() -> InMemorySpanExporter:
    """The process-wide in-memory exporter (OpenTelemetry takes one provider per process: reuse it)."""
    global _EXPORTER
    if _EXPORTER is None:
        provider = trace.get_tracer_provider()
        if not isinstance(provider, TracerProvider):
            provider = TracerProvider()
            trace.set_tracer_provider(provider)
        _EXPORTER = InMemorySpanExporter()
        provider.add_span_processor(SimpleSpanProcessor(_EXPORTER))
    return _EXPORTER

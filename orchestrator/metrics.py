"""Prometheus metrics of the ingress, ingest and relay (one registry per process)."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, Counter, Gauge, Histogram, generate_latest

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
INGEST_MESSAGES = Counter("dayzero_ingest_messages_total", "Kafka task messages by outcome", ["outcome"])
INGEST_BATCH_SECONDS = Histogram("dayzero_ingest_batch_seconds", "DB time per ingest batch")
INGEST_PAUSED = Gauge("dayzero_ingest_paused", "1 while ingest pauses its partitions (back-pressure)")
RELAY_PUBLISHED = Counter("dayzero_relay_published_total", "outbox events published", ["topic"])
RELAY_LAG = Gauge("dayzero_relay_unpublished", "outbox events not yet published (last batch)")


def render() -> tuple[bytes, str]:
    return generate_latest(), CONTENT_TYPE_LATEST

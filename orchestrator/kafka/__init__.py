"""Kafka ingress: the `dayzero.tasks` ingest consumer, its DLQ, and producer helpers."""

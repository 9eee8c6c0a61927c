"""Start-up shared by the Kafka-facing long-running commands (`dayzero ingest`, `dayzero relay`)."""

from __future__ import annotations

import argparse
import logging
from typing import Any


def add_kafka_process_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upgrade", action="store_true", help="apply migrations first")
    p.add_argument("--no-create-topics", action="store_true", help="do not create missing topics")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")


def start_kafka_process(args: argparse.Namespace, topics: Any) -> tuple[Any, Any, str]:
    """Logging, optional metrics server, settings, topic creation. Returns (settings, kafka, bootstrap).

    `topics(kafka)` names the topics this process needs created."""
    from orchestrator.config import Settings
    from orchestrator.kafka.config import KafkaSettings
    from orchestrator.kafka.topics import ensure_topics
    from orchestrator.tracing import setup_tracing

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    settings, kafka = Settings(), KafkaSettings()
    setup_tracing(f"dayzero-{args.command}", settings.otlp_endpoint)
    if not settings.kafka_bootstrap_servers:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set")
    bootstrap = settings.kafka_bootstrap_servers
    if not args.no_create_topics:
        ensure_topics(bootstrap, topics(kafka), kafka.partitions)
    return settings, kafka, bootstrap

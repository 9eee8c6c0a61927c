"""Start-up shared by the Kafka-facing long-running commands (`dayzero ingest`, `dayzero relay`).

Both wait out a database or broker that is down at start-up (and later: see their loops) instead
of exiting, and serve /healthz, /readyz and /metrics (`orchestrator.probes`)."""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from orchestrator.commands.signals import stop_on_signals

T = TypeVar("T")
log = logging.getLogger("dayzero")


def add_kafka_process_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--upgrade", action="store_true", help="apply migrations first")
    p.add_argument("--no-create-topics", action="store_true", help="do not create missing topics")
    add_probe_arguments(p)


def add_probe_arguments(p: argparse.ArgumentParser) -> None:
    """`--metrics-port` / `--metrics-host` of the long-running commands without an HTTP API."""
    p.add_argument(
        "--metrics-port", type=int, default=None, help="serve /metrics, /healthz and /readyz on this port"
    )
    p.add_argument(
        "--metrics-host",
        default=os.environ.get("DAYZERO_METRICS_HOST", "127.0.0.1"),
        help="address the metrics/probe port binds (or DAYZERO_METRICS_HOST; a pod needs 0.0.0.0; default: %(default)s)",
    )


@dataclass
class KafkaProcess:
    settings: Any
    kafka: Any
    bootstrap: str
    health: Any
    stop: threading.Event

    def retry(self, what: str, fn: Callable[[], T]) -> T:
        """`fn()` until it succeeds, backing off while the database or broker is unavailable."""
        from orchestrator.probes import retry_until_up

        return retry_until_up(what, fn, self.stop, self.health)


def start_kafka_process(args: argparse.Namespace, topics: Any) -> KafkaProcess:
    """Logging, the probe server, settings, topic creation (retried until the broker answers).

    `topics(kafka)` names the topics this process needs created."""
    from orchestrator.config import Settings
    from orchestrator.kafka.topics import ensure_topics
    from orchestrator.probes import Health, serve_probes
    from orchestrator.tracing import setup_tracing

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    health = Health()
    if args.metrics_port is not None:
        serve_probes(args.metrics_host, args.metrics_port, health)
    settings = Settings()
    kafka = settings.kafka
    setup_tracing(f"dayzero-{args.command}", settings.otlp_endpoint)
    if not settings.kafka_bootstrap_servers:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set")
    # The commands hand the signals over to their loop once it exists (`signals.hand_over`).
    proc = KafkaProcess(settings, kafka, settings.kafka_bootstrap_servers, health, stop_on_signals())
    if not args.no_create_topics:
        proc.retry("creating topics", lambda: ensure_topics(proc.bootstrap, topics(kafka), kafka.partitions))
    return proc

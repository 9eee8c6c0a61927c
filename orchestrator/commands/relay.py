"""`dayzero relay`: publish the outbox to `dayzero.events` / `dayzero.results`."""

from __future__ import annotations

import argparse
import logging
import signal


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("relay", help="publish task events and results to Kafka (the outbox relay)")
    p.add_argument("--upgrade", action="store_true", help="apply migrations first")
    p.add_argument("--no-create-topics", action="store_true", help="do not create missing topics")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    p.add_argument("--batch-size", type=int, default=500, help="events per publish round")
    p.set_defaults(func=_relay)


def _relay(args: argparse.Namespace) -> int:
    from orchestrator.app import make_db
    from orchestrator.config import Settings
    from orchestrator.kafka.config import KafkaSettings
    from orchestrator.kafka.topics import ensure_topics
    from orchestrator.relay import Relay, RelayConfig, make_relay_producer

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    settings, kafka = Settings(), KafkaSettings()
    if not settings.kafka_bootstrap_servers:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set")
    if not args.no_create_topics:
        ensure_topics(
            settings.kafka_bootstrap_servers, [kafka.events_topic, kafka.results_topic], kafka.partitions
        )
    engine = make_db(settings, upgrade=args.upgrade)
    producer = make_relay_producer(settings.kafka_bootstrap_servers)
    relay = Relay(
        engine,
        producer,
        RelayConfig(
            events_topic=kafka.events_topic, results_topic=kafka.results_topic, batch_size=args.batch_size
        ),
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: relay.stop())
    try:
        relay.run_forever()
    finally:
        producer.close()
        engine.dispose()
    return 0

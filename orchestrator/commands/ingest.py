"""`dayzero ingest`: consume `dayzero.tasks` into task rows (see orchestrator.kafka.ingest)."""

from __future__ import annotations

import argparse
import json
import logging
import signal


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="consume task submissions from Kafka (dayzero.tasks)")
    p.add_argument("--upgrade", action="store_true", help="apply migrations first")
    p.add_argument("--no-create-topics", action="store_true", help="do not create missing topics")
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    p.set_defaults(func=_ingest)


def _ingest(args: argparse.Namespace) -> int:
    from orchestrator.api.config import IngressSettings
    from orchestrator.app import make_db
    from orchestrator.config import Settings
    from orchestrator.kafka.config import KafkaSettings
    from orchestrator.kafka.ingest import Ingestor, make_consumer, make_dlq_producer
    from orchestrator.kafka.topics import ensure_topics

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.metrics_port is not None:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port)
    settings, kafka = Settings(), KafkaSettings()
    if not settings.kafka_bootstrap_servers:
        raise SystemExit("KAFKA_BOOTSTRAP_SERVERS is not set")
    bootstrap = settings.kafka_bootstrap_servers
    if not args.no_create_topics:
        ensure_topics(bootstrap, [kafka.tasks_topic, kafka.dlq_topic], kafka.partitions)
    engine = make_db(settings, upgrade=args.upgrade)
    consumer = make_consumer(bootstrap, kafka)
    producer = make_dlq_producer(bootstrap)
    ingestor = Ingestor(
        engine, consumer, producer, settings, kafka, max_message_bytes=IngressSettings().max_body_bytes
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: ingestor.stop())
    logging.getLogger("dayzero").info("ingest consuming %s as group %s", kafka.tasks_topic, kafka.group_id)
    try:
        ingestor.run_forever()
    finally:
        consumer.close()
        producer.close()
        engine.dispose()
    logging.getLogger("dayzero").info("ingest stopped: %s", json.dumps(ingestor.stats))
    return 0

"""`dayzero ingest`: consume `dayzero.tasks` into task rows (see orchestrator.kafka.ingest)."""

from __future__ import annotations

import argparse
import json
import logging

from orchestrator.commands.kafka_process import add_kafka_process_arguments, start_kafka_process
from orchestrator.commands.signals import hand_over


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("ingest", help="consume task submissions from Kafka (dayzero.tasks)")
    add_kafka_process_arguments(p)
    p.set_defaults(func=_ingest)


def _ingest(args: argparse.Namespace) -> int:
    from orchestrator.app import make_db
    from orchestrator.kafka.ingest import Ingestor, make_consumer, make_dlq_producer

    proc = start_kafka_process(args, lambda k: [k.tasks_topic, k.dlq_topic])
    kafka = proc.kafka
    if kafka.allowed_tenants is not None and not kafka.allowed_tenants:
        raise SystemExit(
            "DAYZERO_KAFKA_TENANTS is empty: list the tenants this ingest may create tasks for "
            "(comma-separated), or '*' for every tenant holding an API key"
        )
    engine = proc.retry("connecting to the database", lambda: make_db(proc.settings, upgrade=args.upgrade))
    consumer = proc.retry("connecting to the broker", lambda: make_consumer(proc.bootstrap, kafka))
    producer = proc.retry("connecting to the broker", lambda: make_dlq_producer(proc.bootstrap))
    ingestor = Ingestor(
        engine,
        consumer,
        producer,
        proc.settings,
        kafka,
        max_message_bytes=proc.settings.ingress.max_body_bytes,
        health=proc.health,
        producer_factory=lambda: make_dlq_producer(proc.bootstrap),
    )
    hand_over(proc.stop, ingestor.stop)
    logging.getLogger("dayzero").info("ingest consuming %s as group %s", kafka.tasks_topic, kafka.group_id)
    try:
        ingestor.run_forever()
    finally:
        ingestor.incarnations.close()
        consumer.close()
        if ingestor.producer is not None:  # None while a replacement could not be built
            ingestor.producer.close()
        engine.dispose()
    logging.getLogger("dayzero").info("ingest stopped: %s", json.dumps(ingestor.stats))
    return 0

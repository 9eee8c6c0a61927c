"""`dayzero relay`: publish the outbox to `dayzero.events` / `dayzero.results`."""

from __future__ import annotations

import argparse

from orchestrator.commands.kafka_process import add_kafka_process_arguments, start_kafka_process
from orchestrator.commands.signals import hand_over


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("relay", help="publish task events and results to Kafka (the outbox relay)")
    add_kafka_process_arguments(p)
    p.add_argument(
        "--batch-size", type=int, default=500, help="events per publish round (default: %(default)s)"
    )
    p.set_defaults(func=_relay)


def _relay(args: argparse.Namespace) -> int:
    from orchestrator.app import make_db
    from orchestrator.kafka.relay import Relay, RelayConfig, make_relay_producer

    proc = start_kafka_process(args, lambda k: [k.events_topic, k.results_topic])
    engine = proc.retry("connecting to the database", lambda: make_db(proc.settings, upgrade=args.upgrade))
    producer = proc.retry("connecting to the broker", lambda: make_relay_producer(proc.bootstrap))
    kafka = proc.kafka
    relay = Relay(
        engine,
        producer,
        RelayConfig(
            events_topic=kafka.events_topic, results_topic=kafka.results_topic, batch_size=args.batch_size
        ),
        health=proc.health,
        producer_factory=lambda: make_relay_producer(proc.bootstrap),
    )
    hand_over(proc.stop, relay.stop)
    try:
        relay.run_forever()
    finally:
        if relay.producer is not None:  # None while a replacement could not be built
            relay.producer.close()
        engine.dispose()
    return 0

"""Kafka fixtures: a real broker (tansu), per-test topics and group, PostgreSQL only."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orchestrator.auth import create_api_key
from orchestrator.config import KafkaSettings, Settings
from orchestrator.kafka.ingest import Ingestor, make_consumer, make_dlq_producer
from orchestrator.kafka.topics import ensure_topics
from testing.kafka_broker import kafka_broker  # noqa: F401 - the session broker fixture

FAST_GROUP = {"session_timeout_ms": 4000, "heartbeat_interval_ms": 1000, "max_poll_interval_ms": 5000}


@pytest.fixture
def db_url(pg_url) -> str:  # Kafka and relay tests run on PostgreSQL
    return pg_url


@pytest.fixture
def kafka_settings(kafka_broker) -> KafkaSettings:  # noqa: F811
    s = uuid.uuid4().hex[:8]
    ks = KafkaSettings(
        tasks_topic=f"tasks-{s}",
        dlq_topic=f"dlq-{s}",
        events_topic=f"events-{s}",
        results_topic=f"results-{s}",
        group_id=f"ingest-{s}",
        partitions=3,
        tenants_csv="acme,globex",
        **FAST_GROUP,
    )
    ensure_topics(
        kafka_broker.bootstrap, [ks.tasks_topic, ks.dlq_topic, ks.events_topic, ks.results_topic], 3
    )
    return ks


@pytest.fixture
def tenants(db: Engine) -> dict[str, str]:
    with db.begin() as conn:
        return {t: create_api_key(conn, t).key for t in ("acme", "globex")}


@pytest.fixture
def producer(kafka_broker) -> Iterator[Any]:  # noqa: F811
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=kafka_broker.bootstrap, acks="all", linger_ms=5)
    yield p
    p.close()


@pytest.fixture
def make_ingestor(db: Engine, kafka_broker, kafka_settings, tmp_path) -> Iterator[Any]:  # noqa: F811
    made: list[Ingestor] = []

    def factory(max_message_bytes: int = 64 * 1024, consumer: Any = None, **overrides: Any) -> Ingestor:
        ks = kafka_settings.model_copy(update=overrides) if overrides else kafka_settings
        settings = Settings(
            DATABASE_URL=str(db.url),
            DAYZERO_BLOB_DIR=str(tmp_path / "blobs"),
            DAYZERO_TOOL_MODULES="testing.fixture_tools",
        )
        ing = Ingestor(
            db,
            consumer or make_consumer(kafka_broker.bootstrap, ks),
            make_dlq_producer(kafka_broker.bootstrap),
            settings,
            ks,
            max_message_bytes=max_message_bytes,
        )
        made.append(ing)
        return ing

    yield factory
    for ing in made:
        ing.incarnations.close()
        ing.consumer.close()
        ing.producer.close()

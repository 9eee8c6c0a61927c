"""End to end through Kafka: produce a task → ingest → runner (scripted model) → relay → dayzero.results."""

from __future__ import annotations

import json
import time

from orchestrator.kafka.producer import send_task
from orchestrator.kafka.relay import Relay, RelayConfig, make_relay_producer
from orchestrator.store import get_task, list_events
from testing.kafka_broker import consume_all


def test_kafka_task_runs_to_completion_and_result_is_published(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor, make_runner
):
    script = {"cycles": 2, "tool": "echo"}
    send_task(
        producer,
        "acme",
        {"goal": "script:" + json.dumps(script), "metadata": {"order": "o-1"}},
        idempotency_key="e2e-1",
        topic=kafka_settings.tasks_topic,
    ).get(timeout=10)
    ing = make_ingestor()
    end = time.monotonic() + 30
    while ing.stats["created"] < 1 and time.monotonic() < end:
        ing.run_once()
    assert ing.stats["created"] == 1

    make_runner().run_until_idle(timeout_s=60)

    relay_producer = make_relay_producer(kafka_broker.bootstrap)
    try:
        relay = Relay(
            db,
            relay_producer,
            RelayConfig(events_topic=kafka_settings.events_topic, results_topic=kafka_settings.results_topic),
        )
        published = relay.run_until_drained()
    finally:
        relay_producer.close()

    results = consume_all(kafka_broker.bootstrap, kafka_settings.results_topic, 1)
    assert len(results) == 1
    result = json.loads(results[0].value)
    task_id = results[0].key.decode()
    assert result["task_id"] == task_id and result["tenant"] == "acme"
    assert result["status"] == "SUCCEEDED" and result["result"] == "done after 2 tool calls"
    assert result["usage"]["steps"] == 5 and result["metadata"] == {"order": "o-1"}
    with db.connect() as conn:
        assert get_task(conn, task_id).idempotency_key == "e2e-1"
        db_events = [(e.seq, e.type) for e in list_events(conn, task_id)]
    assert published == len(db_events)
    events = consume_all(kafka_broker.bootstrap, kafka_settings.events_topic, len(db_events))
    got = [(json.loads(m.value)["seq"], json.loads(m.value)["type"]) for m in events]
    assert got == db_events  # one task → one partition → in order
    assert got[-1][1] == "task.succeeded"

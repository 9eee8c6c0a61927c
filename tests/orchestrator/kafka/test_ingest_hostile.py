"""Kafka ingest under hostile records and outages (issue 15): every defect found there, one test each."""

from __future__ import annotations

import json
import threading
import time

from sqlalchemy import select

from orchestrator.store import tasks_t
from testing.db_outage import database_down
from testing.kafka_broker import consume_all


def _run_until(ing, cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        ing.run_once()
        if cond():
            return
    raise TimeoutError("condition not reached")


def _keys(db) -> list[str]:
    with db.connect() as conn:
        return sorted(conn.execute(select(tasks_t.c.idempotency_key)).scalars())


def test_deeply_nested_record_is_dead_lettered_and_ingest_goes_on(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    # Before: json.loads raised RecursionError out of run_once, on this record after every restart.
    deep = b'{"tenant": "acme", "goal": "x", "metadata": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    nested_dicts = json.dumps({"tenant": "acme", "goal": "y", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "t", "x": json.loads("[" * 70 + "]" * 70)}]}]}).encode()  # fmt: skip
    producer.send(kafka_settings.tasks_topic, key=b"deep", value=deep)
    producer.send(kafka_settings.tasks_topic, key=b"dicts", value=nested_dicts)
    producer.send(
        kafka_settings.tasks_topic, key=b"ok", value=json.dumps({"tenant": "acme", "goal": "ok"}).encode()
    )
    producer.flush()
    ing = make_ingestor(max_message_bytes=1024 * 1024)
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["dlq"] >= 3)
    assert ing.stats["created"] == 1 and ing.stats["dlq"] == 2
    assert _keys(db) == ["ok"]
    dlq = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, 2)
    assert sorted((m.key, dict(m.headers)["dlq-reason"]) for m in dlq) == [
        (b"deep", b"too_deep"),
        (b"dicts", b"too_deep"),
    ]


def test_tenant_must_be_on_this_deployments_allow_list(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    # Before: any tenant holding an API key was accepted from any producer on the topic.
    for key, tenant in ((b"a", "acme"), (b"g", "globex"), (b"i", "initech")):
        producer.send(
            kafka_settings.tasks_topic,
            key=key,
            value=json.dumps({"tenant": tenant, "goal": key.decode()}).encode(),
        )
    producer.flush()
    ing = make_ingestor(
        tenants_csv="acme,initech"
    )  # globex holds a key but is not listed; initech holds none
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["dlq"] >= 3)
    assert _keys(db) == ["a"]
    dlq = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, 2)
    assert sorted((m.key, dict(m.headers)["dlq-reason"]) for m in dlq) == [
        (b"g", b"tenant_not_allowed"),
        (b"i", b"unknown_tenant"),
    ]


def test_database_outage_is_waited_out(db, tenants, producer, kafka_settings, make_ingestor):
    # Before: the first OperationalError ended run_forever (and `dayzero ingest` with it).
    ing = make_ingestor()
    worker = threading.Thread(target=ing.run_forever, daemon=True)
    worker.start()
    dbname = db.url.database
    try:
        with database_down(dbname):
            for i in range(20):
                producer.send(
                    kafka_settings.tasks_topic,
                    key=f"k{i:02}".encode(),
                    value=json.dumps({"tenant": "acme", "goal": f"g{i:02}"}).encode(),
                )
            producer.flush()
            end = time.monotonic() + 30
            while ing.stats["outages"] == 0 and time.monotonic() < end:
                time.sleep(0.1)
            assert ing.stats["outages"] > 0 and not ing.health.ready and worker.is_alive()
        end = time.monotonic() + 60
        while len(_keys(db)) < 20 and time.monotonic() < end:
            time.sleep(0.2)
    finally:
        ing.stop()
        worker.join(30)
    assert _keys(db) == [f"k{i:02}" for i in range(20)]
    assert ing.health.ready


NON_FINITE = {
    "meta-overflow": b'{"tenant": "acme", "goal": "x", "metadata": {"n": 1e400}}',
    "meta-nan": b'{"tenant": "acme", "goal": "x", "metadata": {"n": NaN}}',
    "meta-neg": b'{"tenant": "acme", "goal": "x", "metadata": {"n": -1e400}}',
    "part-inf": b'{"tenant": "acme", "goal": "x", "messages": [{"role": "user", "content": '
    b'[{"type": "text", "text": "t", "w": Infinity}]}]}',
    "call-nan": b'{"tenant": "acme", "goal": "x", "messages": [{"role": "assistant", "tool_calls": '
    b'[{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}, "w": -Infinity}]}]}',
}


def test_non_finite_numbers_are_dead_lettered_and_ingest_goes_on(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    # Before: json.loads read them as inf/nan, the JSONB insert raised DataError, ingest took it
    # for a database outage and retried the batch forever: the partition stopped.
    for key, value in NON_FINITE.items():
        producer.send(kafka_settings.tasks_topic, key=key.encode(), value=value, partition=0)
    ok = json.dumps({"tenant": "acme", "goal": "ok"}).encode()
    producer.send(kafka_settings.tasks_topic, key=b"after", value=ok, partition=0)
    producer.flush()
    ing = make_ingestor()
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["dlq"] >= len(NON_FINITE) + 1)
    assert _keys(db) == ["after"] and ing.stats["outages"] == 0
    dlq = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, len(NON_FINITE))
    assert sorted((m.key.decode(), dict(m.headers)["dlq-reason"]) for m in dlq) == sorted(
        (k, b"invalid_number") for k in NON_FINITE
    )


def test_kafka_allows_the_same_nesting_as_rest(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    # Before: ingest allowed 64 levels where REST allows 32 (`DAYZERO_INGRESS_MAX_JSON_DEPTH`).
    metadata_deep = {"tenant": "acme", "goal": "x", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "t", "x": json.loads("[" * 40 + "]" * 40)}]}]}  # fmt: skip
    producer.send(kafka_settings.tasks_topic, key=b"deep40", value=json.dumps(metadata_deep).encode())
    producer.flush()
    ing = make_ingestor()
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["dlq"] >= 1)
    dlq = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, 1)
    assert [(m.key, dict(m.headers)["dlq-reason"]) for m in dlq] == [(b"deep40", b"too_deep")]


def test_keyless_records_of_a_recreated_topic_get_new_keys(db, tenants, kafka_settings, make_ingestor):
    # Before: the derived key was `kafka:<topic>:<partition>:<offset>`; a re-created topic starts
    # at offset 0 again, so its records were taken for replays of the old topic's tasks.
    from kafka.consumer.fetcher import ConsumerRecord

    ing = make_ingestor()
    value = json.dumps({"tenant": "acme", "goal": "g"}).encode()

    def record(timestamp: int) -> ConsumerRecord:
        return ConsumerRecord(
            kafka_settings.tasks_topic, 0, -1, 0, timestamp, 0, None, value, [], None, -1, len(value), -1
        )

    old, new = ing.parse(record(1_700_000_000_000)), ing.parse(record(1_700_000_500_000))
    assert old.key != new.key and old.key.startswith(f"kafka:{kafka_settings.tasks_topic}:0:0:")


def test_unknown_allowed_tools_are_dead_lettered_invalid_task(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    # Before: ["rm_rf"] became a task; [] (no tools) stays valid.
    for key, tools in ((b"bad", ["rm_rf", "echo"]), (b"none", []), (b"ok", ["echo"])):
        body = {"tenant": "acme", "goal": "x", "allowed_tools": tools}
        producer.send(kafka_settings.tasks_topic, key=key, value=json.dumps(body).encode())
    producer.flush()
    ing = make_ingestor()
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["dlq"] >= 3)
    assert _keys(db) == ["none", "ok"]
    (m,) = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, 1)
    headers = dict(m.headers)
    assert m.key == b"bad" and headers["dlq-reason"] == b"invalid_task"
    assert b"rm_rf" in headers["dlq-error"] and b"calculator" in headers["dlq-error"]


def test_a_topic_recreated_under_the_consumer_is_read_from_its_beginning(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    # Before: the consumer's position (30) lay inside the re-created topic's records, and its
    # first 30 records were skipped silently (never ingested, never dead-lettered).
    from kafka import KafkaAdminClient, KafkaConsumer, TopicPartition

    from orchestrator.kafka.topics import ensure_topics
    from orchestrator.tasks.queries import task_goals

    topic = kafka_settings.tasks_topic
    consumer = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap,
        group_id=kafka_settings.group_id,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    consumer.assign([TopicPartition(topic, p) for p in range(3)])  # no rebalance resets the position
    ing = make_ingestor(consumer=consumer)

    def send(n: int, goal: str) -> None:
        for i in range(n):
            value = json.dumps({"tenant": "acme", "goal": f"{goal}-{i}"}).encode()
            producer.send(topic, value=value, partition=0)  # keyless: the key is derived
        producer.flush()

    send(30, "old")
    _run_until(ing, lambda: ing.stats["created"] >= 30)
    old_id = ing.incarnations.id_of(topic)
    admin = KafkaAdminClient(bootstrap_servers=kafka_broker.bootstrap)
    admin.delete_topics([topic])
    admin.close()
    time.sleep(1.0)
    ensure_topics(kafka_broker.bootstrap, [topic], 3)
    send(40, "new")
    _run_until(ing, lambda: ing.stats["created"] >= 70, timeout_s=60)
    with db.connect() as conn:
        ids = list(conn.execute(select(tasks_t.c.id)).scalars())
        goals = set(task_goals(conn, ids).values())
    assert {f"new-{i}" for i in range(40)} <= goals and len(goals) == 70
    assert ing.incarnations.restarts >= 1 and ing.incarnations.id_of(topic) not in (None, old_id)
    keys = _keys(db)
    assert sum(k.endswith(f":{old_id}") for k in keys) == 30  # the topic's id is in the derived key

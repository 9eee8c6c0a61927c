"""Kafka ingest against a real broker and PostgreSQL: dedupe, DLQ, back-pressure."""

from __future__ import annotations

import json
import random
import time

from sqlalchemy import func, select

from orchestrator.store import request_cancel, tasks_t
from testing.kafka_broker import consume_all
from testing.otel import span_exporter


def _run_until(ing, cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        ing.run_once()
        if cond():
            return
    raise TimeoutError("condition not reached")


def _count(db) -> int:
    with db.connect() as conn:
        return conn.execute(select(func.count()).select_from(tasks_t)).scalar_one()


def test_thousand_messages_with_duplicates_and_invalid(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    rng = random.Random(7)
    valid: list[tuple[bytes, bytes]] = []
    for i in range(850):
        tenant = "acme" if i % 3 else "globex"
        body = {"tenant": tenant, "goal": f"task {i}", "metadata": {"i": i}}
        if i % 5 == 0:
            body["messages"] = [{"role": "user", "content": "earlier"}]
            body["budget"] = {"max_steps": 7}
        valid.append((f"key-{i}".encode(), json.dumps(body).encode()))
    duplicates = [rng.choice(valid) for _ in range(100)]
    invalid: list[tuple[bytes | None, bytes, str]] = []
    for i in range(50):
        kind = i % 6
        key = f"bad-{i}".encode()
        if kind == 0:
            invalid.append((key, b"{not json", "bad_json"))
        elif kind == 1:
            invalid.append((key, json.dumps({"tenant": "acme"}).encode(), "schema"))
        elif kind == 2:
            invalid.append(
                (key, json.dumps({"tenant": "nobody", "goal": "x"}).encode(), "tenant_not_allowed")
            )
        elif kind == 3:
            invalid.append((key, json.dumps({"tenant": "acme", "goal": "x" * 70_000}).encode(), "oversize"))
        elif kind == 4:
            # same key as a valid task, different body
            k, v = valid[i]
            invalid.append(
                (
                    k,
                    json.dumps({"tenant": json.loads(v)["tenant"], "goal": "changed"}).encode(),
                    "idempotency_conflict",
                )
            )
        else:
            invalid.append(
                (
                    key,
                    json.dumps({"tenant": "acme", "goal": "x", "budget": {"max_steps": 0}}).encode(),
                    "schema",
                )
            )
    # valid first occurrences come before their duplicates and conflicting variants
    stream = [(k, v, None) for k, v in valid] + [(k, v, None) for k, v in duplicates] + invalid
    head, tail = stream[:850], stream[850:]
    rng.shuffle(tail)
    for k, v, _ in head + tail:
        producer.send(kafka_settings.tasks_topic, key=k, value=v)
    producer.flush()

    ing = make_ingestor()
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["duplicate"] + ing.stats["dlq"] >= 1000, 60)
    assert ing.stats == {**ing.stats, "created": 850, "duplicate": 100, "dlq": 50}

    with db.connect() as conn:
        rows = conn.execute(
            select(tasks_t.c.tenant, tasks_t.c.idempotency_key, tasks_t.c.status, tasks_t.c.max_steps)
        ).all()
    assert len(rows) == 850
    assert sorted(r.idempotency_key for r in rows) == sorted(k.decode() for k, _ in valid)
    assert {r.status for r in rows} == {"READY"}
    assert {r.max_steps for r in rows} == {7, 64}

    dlq = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, 50)
    assert len(dlq) == 50
    got = sorted((m.key, m.value, dict(m.headers)["dlq-reason"].decode()) for m in dlq)
    want = sorted((k, v if len(v) <= 64 * 1024 else v[:1024], reason) for k, v, reason in invalid)
    assert got == want
    assert all(dict(m.headers)["dlq-error"] for m in dlq)
    assert {dict(m.headers)["dlq-source-topic"].decode() for m in dlq} == {kafka_settings.tasks_topic}


def test_back_pressure_pauses_and_resumes(db, tenants, producer, kafka_settings, make_ingestor):
    for i in range(60):
        producer.send(
            kafka_settings.tasks_topic,
            key=f"k{i}".encode(),
            value=json.dumps({"tenant": "acme", "goal": f"g{i}"}).encode(),
        )
    producer.flush()
    ing = make_ingestor(batch_max=5, max_pending=20)
    _run_until(ing, lambda: ing.paused, 30)
    for _ in range(10):
        ing.run_once()
    stalled = _count(db)
    assert 20 <= stalled <= 25  # overshoot is at most one batch
    assert ing.consumer.paused()
    time.sleep(0.6)
    for _ in range(5):
        ing.run_once()
    assert _count(db) == stalled  # nothing consumed while paused

    # the runners drain the backlog (here: cancel them) and ingest resumes, pausing again at 20
    def drain() -> bool:
        with db.begin() as conn:
            for (tid,) in conn.execute(select(tasks_t.c.id).where(tasks_t.c.status == "READY")).all():
                request_cancel(conn, tid)
        return _count(db) == 60

    assert ing.paused
    _run_until(ing, drain, 30)


def test_keyless_and_traced_messages(db, tenants, producer, kafka_settings, make_ingestor):
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    spans = span_exporter()
    spans.clear()
    producer.send(
        kafka_settings.tasks_topic,
        key=None,
        value=json.dumps({"tenant": "acme", "goal": "a"}).encode(),
        headers=[("traceparent", tp.encode())],
    )
    producer.flush()
    ing = make_ingestor()
    _run_until(ing, lambda: ing.stats["created"] == 1)
    with db.connect() as conn:
        row = conn.execute(select(tasks_t)).one()
    assert row.idempotency_key.startswith(f"kafka:{kafka_settings.tasks_topic}:")
    # the task's context is the ingest's consumer span, a child of the producer's (the header)
    (span,) = [s for s in spans.get_finished_spans() if s.name == f"{kafka_settings.tasks_topic} process"]
    assert row.traceparent == f"00-{span.context.trace_id:032x}-{span.context.span_id:016x}-01"
    assert row.traceparent.split("-")[1] == tp.split("-")[1]
    assert f"{span.parent.span_id:016x}" == tp.split("-")[2]
    assert span.attributes["dayzero.task_id"] == row.id and span.attributes["messaging.system"] == "kafka"


def test_inline_image_and_unknown_upload_via_kafka(
    db, tenants, producer, kafka_settings, kafka_broker, make_ingestor
):
    import base64

    from orchestrator.store import attachments_t

    png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\x00" * 32).decode()
    img = {"tenant": "acme", "goal": "look", "attachments": [{"data": png, "media_type": "image/png"}]}
    ghost = {"tenant": "acme", "goal": "look", "attachments": [{"upload_id": "no-such-upload"}]}
    for key, body in ((b"img-1", img), (b"img-1", img), (b"ghost", ghost)):
        producer.send(kafka_settings.tasks_topic, key=key, value=json.dumps(body).encode())
    producer.flush()
    ing = make_ingestor()
    _run_until(ing, lambda: ing.stats["created"] + ing.stats["duplicate"] + ing.stats["dlq"] >= 3)
    assert (ing.stats["created"], ing.stats["duplicate"], ing.stats["dlq"]) == (1, 1, 1)
    with db.connect() as conn:
        task = conn.execute(select(tasks_t)).one()
        atts = conn.execute(select(attachments_t)).all()
    assert task.status == "PREPROCESSING" and [a.task_id for a in atts] == [task.id]
    (dead,) = consume_all(kafka_broker.bootstrap, kafka_settings.dlq_topic, 1)
    assert dict(dead.headers)["dlq-reason"] == b"unknown_attachment"

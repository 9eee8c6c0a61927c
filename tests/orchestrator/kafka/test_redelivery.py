"""`dayzero ingest` SIGKILLed between the DB commit and the offset commit, then restarted: no duplicates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from sqlalchemy import func, select

from orchestrator.store import tasks_t
from tests.orchestrator.kafka.conftest import FAST_GROUP


def _env(db, kafka_broker, ks, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "DATABASE_URL": db.url.render_as_string(hide_password=False),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
        "DAYZERO_KAFKA_TASKS_TOPIC": ks.tasks_topic,
        "DAYZERO_KAFKA_DLQ_TOPIC": ks.dlq_topic,
        "DAYZERO_KAFKA_GROUP_ID": ks.group_id,
        "DAYZERO_KAFKA_BATCH_MAX": "50",
        "DAYZERO_KAFKA_TENANTS": "acme,globex",
        **{f"DAYZERO_KAFKA_{k.upper()}": str(v) for k, v in FAST_GROUP.items()},
        **extra,
    }
    env.pop("DAYZERO_FAILPOINTS", None)
    env.update({k: v for k, v in extra.items()})
    return env


def _ingest(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "ingest"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _rows(db) -> tuple[int, int]:
    with db.connect() as conn:
        n = conn.execute(select(func.count()).select_from(tasks_t)).scalar_one()
        keys = conn.execute(select(func.count(func.distinct(tasks_t.c.idempotency_key)))).scalar_one()
    return n, keys


def _committed(kafka_broker, ks) -> int:
    from kafka import KafkaConsumer, TopicPartition

    c = KafkaConsumer(
        bootstrap_servers=kafka_broker.bootstrap, group_id=ks.group_id, enable_auto_commit=False
    )
    try:
        return sum(c.committed(TopicPartition(ks.tasks_topic, p)) or 0 for p in range(3))
    finally:
        c.close()


def test_sigkill_after_db_commit_then_restart_creates_no_duplicates(
    db, tenants, producer, kafka_settings, kafka_broker
):
    total = 200
    for i in range(total):
        producer.send(
            kafka_settings.tasks_topic,
            key=f"order-{i}".encode(),
            value=json.dumps({"tenant": "acme", "goal": f"g{i}"}).encode(),
        )
    producer.flush()

    crashed = _ingest(_env(db, kafka_broker, kafka_settings, DAYZERO_FAILPOINTS="ingest.after_db_commit=1"))
    out, _ = crashed.communicate(timeout=60)
    assert crashed.returncode == -signal.SIGKILL, out
    first_batch, _ = _rows(db)
    assert first_batch > 0  # the DB commit happened ...
    assert _committed(kafka_broker, kafka_settings) == 0  # ... the offset commit did not

    restarted = _ingest(_env(db, kafka_broker, kafka_settings))
    try:
        end = time.monotonic() + 60
        while time.monotonic() < end and (
            _rows(db)[0] < total or _committed(kafka_broker, kafka_settings) < total
        ):
            time.sleep(0.3)
    finally:
        restarted.send_signal(signal.SIGTERM)
        out, _ = restarted.communicate(timeout=30)
    assert restarted.returncode == 0, out
    assert _rows(db) == (total, total), out
    assert _committed(kafka_broker, kafka_settings) == total
    # the restarted process saw the first batch again and recognised every record of it
    stats = json.loads(out.rsplit("ingest stopped: ", 1)[1].splitlines()[0])
    assert stats["duplicate"] == first_batch and stats["created"] == total - first_batch

"""Kafka → task rows on PostgreSQL: sustained tasks/s of ONE `dayzero ingest` process.

Pre-produces N task messages to `dayzero.tasks` on a local tansu broker (started here unless
`--bootstrap` is given), then starts `dayzero ingest` and watches the row count. The sustained
rate is measured between 10% and 90% of the rows (group join and tail excluded). Prints JSON.

    python -m benchmarks.ingest_kafka [--messages 50000] [--partitions 6] [--batch 1000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import uuid

from sqlalchemy import func, select

from orchestrator.auth import create_api_key
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.db.tables import tasks_t
from orchestrator.kafka.topics import ensure_topics
from testing.kafka_broker import run_tansu

ADMIN_URL = os.environ.get("DAYZERO_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


@contextlib.contextmanager
def scratch_database():
    name = f"dz_bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def produce(bootstrap: str, topic: str, n: int) -> float:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=20, batch_size=256 * 1024)
    t0 = time.perf_counter()
    for i in range(n):
        body = {
            "tenant": "bench",
            "goal": f"summarise document {i} and list the open questions",
            "allowed_tools": ["echo"],
            "budget": {"max_steps": 20},
            "metadata": {"batch": "b1", "i": i},
        }
        producer.send(topic, key=f"bench-{i}".encode(), value=json.dumps(body).encode())
    producer.flush()
    producer.close()
    return time.perf_counter() - t0


def run(bootstrap: str, args: argparse.Namespace) -> dict:
    topic = f"bench-tasks-{uuid.uuid4().hex[:6]}"
    ensure_topics(bootstrap, [topic, topic + ".dlq"], args.partitions)
    with scratch_database() as url:
        engine = make_engine(url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            create_api_key(conn, "bench")
        produce_s = produce(bootstrap, topic, args.messages)
        env = {
            **os.environ,
            "DAYZERO_TOOL_MODULES": "testing.fixture_tools",  # the tasks allow `echo`
            "DATABASE_URL": url,
            "KAFKA_BOOTSTRAP_SERVERS": bootstrap,
            "DAYZERO_KAFKA_TASKS_TOPIC": topic,
            "DAYZERO_KAFKA_DLQ_TOPIC": topic + ".dlq",
            "DAYZERO_KAFKA_GROUP_ID": f"bench-{uuid.uuid4().hex[:6]}",
            "DAYZERO_KAFKA_BATCH_MAX": str(args.batch),
            "DAYZERO_KAFKA_MAX_PENDING": str(10 * args.messages),
            "DAYZERO_KAFKA_TENANTS": "bench",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", "ingest"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        samples: list[tuple[float, int]] = []
        try:
            t_start = time.perf_counter()
            deadline = t_start + args.timeout
            n = 0
            while n < args.messages and time.perf_counter() < deadline:
                with engine.connect() as conn:
                    n = conn.execute(select(func.count()).select_from(tasks_t)).scalar_one()
                samples.append((time.perf_counter(), n))
                time.sleep(0.05)
        finally:
            proc.terminate()
            _, err = proc.communicate(timeout=30)
            engine.dispose()
    if n < args.messages:
        raise SystemExit(f"only {n}/{args.messages} tasks after {args.timeout} s\n{err[-2000:]}")
    lo, hi = 0.1 * args.messages, 0.9 * args.messages
    t_lo = next(t for t, c in samples if c >= lo)
    c_lo = next(c for t, c in samples if c >= lo)
    t_hi = next(t for t, c in samples if c >= hi)
    c_hi = next(c for t, c in samples if c >= hi)
    first = next(t for t, c in samples if c > 0)
    return {
        "benchmark": "kafka_ingest_to_postgres",
        "messages": args.messages,
        "partitions": args.partitions,
        "batch_max": args.batch,
        "ingest_processes": 1,
        "produce_s": round(produce_s, 3),
        "startup_to_first_row_s": round(first - t_start, 3),
        "total_s": round(samples[-1][0] - t_start, 3),
        "sustained_tasks_per_s": round((c_hi - c_lo) / (t_hi - t_lo), 1),
        "overall_tasks_per_s": round(args.messages / (samples[-1][0] - first), 1),
        "cpu_count": os.cpu_count(),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--messages", type=int, default=50_000)
    p.add_argument("--partitions", type=int, default=6)
    p.add_argument("--batch", type=int, default=1000)
    p.add_argument("--timeout", type=float, default=300)
    p.add_argument("--bootstrap", default=None, help="use this broker instead of starting tansu")
    args = p.parse_args()
    if args.bootstrap:
        result = run(args.bootstrap, args)
    else:
        with run_tansu() as broker:
            result = run(broker.bootstrap, args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

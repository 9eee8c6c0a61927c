"""The chaos test's soak variant: the whole stack for minutes, with kills and outages under it.

Same harness as tests/orchestrator/test_chaos.py (testing/chaos.py): `dayzero serve`,
runners, a Celery tools worker, `dayzero ingest` and `dayzero relay` as real processes on
PostgreSQL, a local tansu broker and Redis; tasks arrive by REST and Kafka while processes are
SIGKILLed, database connections cut, the database refused for a while, and the model server and
Redis SIGKILLed and started again seconds later (`--no-service-restarts` leaves them up), and the
Kafka broker frozen for as long (SIGSTOP/SIGCONT; `--no-broker-pauses` leaves it running: the
test broker keeps its log in memory, so a restart proper would lose acknowledged records, and
is tested on its own in the relay's tests). Prints the figures as
JSON: kills and outages, REST answers (503s included), lost / duplicated / stuck work (all must
be empty), same-key tool replays, and task latencies (submission → final state).

    python -m benchmarks.chaos_soak [--chaos-s 300] [--rest 300] [--kafka 300] [--runners 3] [--outages 5]
        [--no-service-restarts] [--no-broker-pauses] [--out docs/results/chaos_soak.json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from benchmarks.ingest_kafka import scratch_database
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from testing.chaos import ChaosConfig, run_chaos
from testing.kafka_broker import run_tansu
from testing.scripted_model import ScriptedModelServer

REDIS_URL = os.environ.get("DAYZERO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chaos-s", type=float, default=300.0, help="seconds of chaos before healing")
    ap.add_argument("--rest", type=int, default=300, help="tasks submitted by REST")
    ap.add_argument("--kafka", type=int, default=300, help="tasks submitted by Kafka")
    ap.add_argument("--cycles", type=int, default=2, help="tool calls per task")
    ap.add_argument("--runners", type=int, default=3)
    ap.add_argument("--outages", type=int, default=5, help="windows in which the DB refuses connections")
    ap.add_argument("--outage-s", type=float, default=3.0)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument(
        "--no-service-restarts",
        action="store_true",
        help="do not restart the model server and Redis (restarted by default)",
    )
    ap.add_argument("--no-broker-pauses", action="store_true", help="do not freeze the Kafka broker")
    ap.add_argument("--out", type=Path, default=None, help="also write the figures here as JSON")
    args = ap.parse_args()
    cfg = ChaosConfig(
        rest_tasks=args.rest,
        kafka_tasks=args.kafka,
        cycles=args.cycles,
        runners=args.runners,
        chaos_s=args.chaos_s,
        outages=args.outages,
        outage_s=args.outage_s,
        seed=args.seed,
        service_restarts=not args.no_service_restarts,
        broker_pauses=not args.no_broker_pauses,
    )
    with scratch_database() as url, run_tansu() as broker, ScriptedModelServer() as model:
        engine = make_engine(url)
        migrate.upgrade(engine)
        with tempfile.TemporaryDirectory(prefix="dz-soak-") as work:
            figures = run_chaos(
                engine=engine,
                db_url=url,
                bootstrap=broker.bootstrap,
                redis_url=REDIS_URL,
                model_url=model.url,
                work_dir=Path(work),
                cfg=cfg,
                broker=broker.process,
            )
        engine.dispose()
    figures["ok"] = not (
        figures["lost"] or figures["duplicated"] or figures["stuck"] or figures["unexpected_exits"]
    )
    text = json.dumps(figures, indent=1, default=str)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0 if figures["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())

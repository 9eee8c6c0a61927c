"""The system chaos test (issue 15): tasks via REST and Kafka while runners, the Celery worker,
ingest and relay are SIGKILLed and the database's connections are cut (and refused for a while).
Nothing may be lost, duplicated or stuck, and no process may exit on its own.

~30 s of chaos, then the stack heals and drains (about a minute in all on 2 shared cores). The
drain is waited for as long as it progresses: the failure says "stuck" (nothing progressed for
`ChaosConfig.stall_s`) or "slow" (still progressing after `drain_max_s`), with a diagnosis.
`benchmarks/chaos_soak.py` runs the same harness for longer and prints the figures."""

from __future__ import annotations

import json

import pytest

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from testing.chaos import ChaosConfig, run_chaos
from testing.kafka_broker import kafka_broker as kafka_broker  # the session broker fixture
from tests.workers.conftest import REDIS_URL


@pytest.mark.slow
@pytest.mark.timeout(1500)  # above the harness's own bounds: it reports, pytest need not kill
def test_chaos_loses_nothing_duplicates_nothing_leaves_nothing_stuck(
    pg_url,
    model_server,
    kafka_broker,
    tmp_path,
):
    engine = make_engine(pg_url)
    migrate.upgrade(engine)
    try:
        figures = run_chaos(
            engine=engine,
            db_url=pg_url,
            bootstrap=kafka_broker.bootstrap,
            redis_url=REDIS_URL,
            model_url=model_server.url,
            work_dir=tmp_path,
            cfg=ChaosConfig(),
        )
    finally:
        engine.dispose()
    print(json.dumps(figures, indent=1, default=str))
    assert figures["drain"] == "drained", (
        f"the stack is {figures['drain']} after {figures['drain_s']} s of healing: "
        + json.dumps(figures.get("diagnosis"), indent=1, default=str)
    )
    assert figures["unexpected_exits"] == []
    assert figures["rest_errors"] == []
    assert figures["lost"] == [] and figures["duplicated"] == [] and figures["stuck"] == []
    assert figures["tasks"] == figures["submitted"] == 48
    kills = figures["kills"]
    assert kills["runner"] >= 3 and sum(kills.values()) >= 8  # the chaos really happened
    assert figures["actions"].get("cut", 0) >= 1 and figures["actions"].get("outage", 0) == 1

"""A runner whose database connections are killed mid-run recovers and finishes its tasks."""

from __future__ import annotations

import threading
import time

from sqlalchemy import text

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.dispatch import InProcessDispatcher
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import get_task, list_attempts
from tests.orchestrator.conftest import submit
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry


def test_runner_survives_killed_database_connections(pg_url, model_server, state_dir, tmp_path):
    db = make_engine(pg_url)
    migrate.upgrade(db)
    ids = [submit(db, {"cycles": 30, "tool": "slow_echo"}) for _ in range(2)]
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    client = OpenAIChatClient(model_server.url, "scripted")
    dispatcher = InProcessDispatcher(registry)
    runner = Runner(db, client, dispatcher, registry, RunnerConfig(lease_s=1.0, poll_interval_s=0.02))
    worker = threading.Thread(target=runner.run_forever, daemon=True)
    worker.start()
    dbname = pg_url.rsplit("/", 1)[1]
    kills = 0
    try:
        for _ in range(5):
            time.sleep(0.4)
            with db.connect() as conn:  # a separate connection: terminate every other one
                kills += conn.execute(
                    text(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                        "WHERE datname = :d AND pid <> pg_backend_pid()"
                    ),
                    {"d": dbname},
                ).scalar_one()
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            with db.connect() as conn:
                if all(get_task(conn, t).status == "SUCCEEDED" for t in ids):
                    break
            time.sleep(0.2)
    finally:
        runner.stop()
        worker.join(timeout=30)
        client.close()
        dispatcher.close()
    assert kills >= 3
    with db.connect() as conn:
        for t in ids:
            assert get_task(conn, t).status == "SUCCEEDED"
            attempts = list_attempts(conn, t)
            assert [(a.step_index, a.attempt) for a in attempts] == [(i, 1) for i in range(61)]
    db.dispose()

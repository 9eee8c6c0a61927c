"""A tool job redelivered after its attempt is over never runs (issue 15).

The whole worker is SIGKILLed after the job's side effect but before its ack. The runner waits
its timeout, records the attempt's outcome and finishes the task. Redis redelivers the job to a
new worker after the visibility timeout (3 s here, ~76 min by default): before this check, the
new worker charged the card a second time."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.dispatch import CeleryDispatcher
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import get_task, list_attempts
from testing.celery_test_app import build_app
from tests.orchestrator.conftest import model_server, submit  # noqa: F401 - model_server is a fixture
from tests.workers.conftest import REDIS_URL, REPO, kill_group, wait_for
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry


def _start_tools_worker(worker_env, name: str, db_url: str, state_dir) -> tuple[subprocess.Popen, object]:
    log = worker_env.log_dir / f"{name}.log"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DZ_TEST_PREFIX": worker_env.prefix,
        "CELERY_BROKER_URL": REDIS_URL,
        "CELERY_RESULT_BACKEND": REDIS_URL,
        "DATABASE_URL": db_url,  # the default fence (orchestrator.runner.fence) reads it
        "DAYZERO_TOOL_MODULES": "testing.fixture_tools",
        "DAYZERO_TEST_STATE_DIR": str(state_dir),
    }
    cmd = [
        sys.executable, "-m", "celery", "-A", "testing.celery_test_app", "worker",
        "--queues", "tools", "--pool", "prefork", "--concurrency", "1", "--loglevel", "INFO",
        "--hostname", f"{name}-{worker_env.prefix}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    wait_for(lambda: b" ready." in log.read_bytes() or proc.poll() is not None, 60, f"worker {name}")
    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    return proc, log


@contextlib.contextmanager
def runner_over_celery(pg_url: str, model_url: str, prefix: str) -> Iterator[tuple[Any, Runner]]:
    """A migrated database and a runner dispatching tool jobs through Celery on Redis (the fixture
    tools registered), closed on exit."""
    db = make_engine(pg_url)
    migrate.upgrade(db)
    app = build_app(REDIS_URL, REDIS_URL, prefix)
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    client = OpenAIChatClient(model_url, "scripted", timeout_s=10)
    dispatcher = CeleryDispatcher(REDIS_URL, REDIS_URL, app=app)
    runner = Runner(db, client, dispatcher, registry, RunnerConfig(lease_s=5.0, poll_interval_s=0.05))
    try:
        yield db, runner
    finally:
        runner.stop()
        dispatcher.close()
        client.close()
        db.dispose()


@pytest.mark.timeout(180)
def test_redelivered_job_of_a_finished_attempt_is_refused(worker_env, pg_url, model_server, tmp_path):  # noqa: F811
    state = tmp_path / "state"
    state.mkdir()
    os.environ["DAYZERO_TEST_STATE_DIR"] = str(state)
    charges = state / "charges.log"
    second = None
    with runner_over_celery(pg_url, model_server.url, worker_env.prefix) as (db, runner):
        first, _ = _start_tools_worker(worker_env, "first", pg_url, state)
        try:
            tid = submit(db, {"cycles": 1, "tool": "slow_charge", "args": {"sleep_s": 60}})
            driver = threading.Thread(target=runner.run_until_idle, kwargs={"timeout_s": 120}, daemon=True)
            driver.start()
            wait_for(charges.exists, 60, "the first charge")
            kill_group(first)  # mid-job, after the side effect, before the ack
            driver.join(120)
            with db.connect() as conn:
                assert get_task(conn, tid).status == "SUCCEEDED"  # the model read the timeout and answered
                tool_attempts = [a for a in list_attempts(conn, tid) if a.step_index == 1]
            assert [(a.attempt, a.status) for a in tool_attempts] == [(1, "FAILED")]
            second, log = _start_tools_worker(worker_env, "second", pg_url, state)
            wait_for(lambda: b"refused" in log.read_bytes(), 60, "the redelivered job to be refused")
            assert f"tool job {tid}:1:1 refused" in log.read_text()
            assert charges.read_text().splitlines() == [f"{tid}:1:1"]  # charged once
            # the refused job is acked just after its refusal is logged: wait for the ack, do not race it
            wait_for(lambda: worker_env.redis.zcard(worker_env.prefix + "unacked_index") == 0, 30, "the ack")
        finally:
            kill_group(first)
            if second is not None:
                kill_group(second)
            os.environ.pop("DAYZERO_TEST_STATE_DIR", None)


def test_fence_refuses_stale_attempts_and_lets_current_ones_run(db_url):
    from sqlalchemy import update

    from orchestrator.clock import utcnow
    from orchestrator.runner.fence import DbAttemptFence
    from orchestrator.store import events_t, tasks_t
    from workers.fence import check_deadline

    db = make_engine(db_url)
    migrate.upgrade(db)
    tid = submit(db, {"cycles": 0})
    with db.begin() as conn:
        # Step 0, a tool step, RUNNING at attempt 2 (the open step lives on the task row).
        conn.execute(
            update(tasks_t)
            .where(tasks_t.c.id == tid)
            .values(
                open_step=0,
                next_step=1,
                open_status="RUNNING",
                open_attempt=2,
                open_started_at=utcnow(),
                lease_owner="r1",
                lease_until=utcnow().replace(year=2100),
            )
        )
    fence = DbAttemptFence(db)
    job = {"task_id": tid, "step_index": 0, "attempt": 2, "runner_id": "r1"}
    assert fence(job) is None
    assert "attempt 2" in fence({**job, "attempt": 1}).reason
    assert "lease" in fence({**job, "runner_id": "r2"}).reason
    assert "no such step" in fence({**job, "step_index": 5}).reason
    with db.begin() as conn:  # the step succeeded: its history row, and no open step
        conn.execute(update(tasks_t).where(tasks_t.c.id == tid).values(open_step=None, open_status=None))
        conn.execute(
            events_t.insert().values(
                task_id=tid,
                seq=99,
                type="step.succeeded",
                created_at=utcnow(),
                step_index=0,
                step_status="SUCCEEDED",
                attempt=2,
            )
        )
    assert "SUCCEEDED at attempt 2" in fence(job).reason
    assert check_deadline({"not_after": time.time() - 1}) is not None
    assert check_deadline({"not_after": time.time() + 60}) is None
    db.dispose()

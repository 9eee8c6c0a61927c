"""Runner *processes* killed with SIGKILL at random points, and several runners on one database.

A task's history must come out as if nothing had happened: no step lost, none executed twice
except under the same idempotency key, and no step ever run by two runners at once.
"""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy import select

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.db.models import Task
from orchestrator.store import get_task, list_attempts, list_messages, list_steps
from tests.orchestrator.conftest import submit

REPO = Path(__file__).resolve().parents[2]


def _runner_env(db_url: str, model_url: str, state_dir: Path, failpoints: str = "") -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAYZERO_", "CELERY_", "KAFKA_"))}
    env.update(
        DATABASE_URL=db_url,
        DAYZERO_INFERENCE_URL=model_url,
        DAYZERO_TOOL_MODULES="testing.fixture_tools",
        DAYZERO_TEST_STATE_DIR=str(state_dir),
        DAYZERO_LEASE_S="1.0",
        DAYZERO_POLL_INTERVAL_S="0.02",
        DAYZERO_WORKSPACE_DIR=str(state_dir / "ws"),
        DAYZERO_FAILPOINTS=failpoints,
        PYTHONPATH=str(REPO),
    )
    return env


def _spawn(env: dict[str, str], log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "runner"],
        cwd=REPO,
        env=env,
        stdout=log.open("ab"),
        stderr=subprocess.STDOUT,
    )


def _progress(engine, ids) -> int:
    """Attempts finished so far (a runner that wrote one has done real work)."""
    with engine.connect() as conn:
        return sum(len(list_attempts(conn, t)) for t in ids)


def _all_done(engine, ids) -> bool:
    with engine.connect() as conn:
        rows = conn.execute(select(Task.status).where(Task.id.in_(ids))).all()
    return all(r.status in ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT") for r in rows)


def _assert_exact_history(engine, ids, state_dir: Path, cycles: int) -> None:
    ledger = (
        collections.Counter((state_dir / "ledger.log").read_text().split())
        if (state_dir / "ledger.log").exists()
        else {}
    )
    with engine.connect() as conn:
        for task_id in ids:
            task = get_task(conn, task_id)
            assert task.status == "SUCCEEDED", (task_id, task.status, task.error)
            assert task.result == f"done after {cycles} tool calls"
            steps = list_steps(conn, task_id)
            assert [s.step_index for s in steps] == list(range(2 * cycles + 1))
            assert all(s.status == "SUCCEEDED" and s.attempt_count == 1 for s in steps), steps
            attempts = list_attempts(conn, task_id)
            assert [(a.step_index, a.attempt, a.status) for a in attempts] == [
                (i, 1, "SUCCEEDED") for i in range(2 * cycles + 1)
            ]
            msgs = list_messages(conn, task_id)
            tool_ids = [m["tool_call_id"] for m in msgs if m["role"] == "tool"]
            assert tool_ids == [f"call_{i}" for i in range(cycles)]  # none lost, none doubled
            if steps[1].tool_name == "ledger":
                for s in steps:
                    if s.kind == "tool":
                        key = f"{task_id}:{s.step_index}:1"
                        # executed at least once; more only when a runner died mid-call (same key)
                        assert ledger[key] >= 1
                keys = [k for k in ledger if k.startswith(task_id + ":")]
                assert all(k.endswith(":1") for k in keys)


@pytest.mark.slow
def test_sigkilled_runners_lose_nothing(pg_url, model_server, tmp_path):
    engine = make_engine(pg_url)
    migrate.upgrade(engine)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    cycles = 10
    # Enough work (~6 s of tool time) that 25 runner lifetimes, each killed soon after it made
    # progress, end before it is done.
    slow = {"i": "{i}", "max_sleep_s": 0.1}
    ids = [
        submit(engine, {"cycles": cycles, "tool": "ledger" if i % 2 else "slow_echo", "args": slow})
        for i in range(8)
    ]
    log = tmp_path / "runners.log"
    rng = random.Random(1234)
    kills = 0
    fp = "before_commit=0.03,after_commit=0.03,before_tool=0.03,after_tool=0.03"
    # Phase 1: runners killed from outside at random instants, plus self-kills at failpoints.
    while kills < 25:
        assert not _all_done(engine, ids), f"the work ran out after {kills} kills; give the test more"
        before = _progress(engine, ids)
        proc = _spawn(_runner_env(pg_url, model_server.url, state_dir, fp), log)
        # Kill mid-work: once this runner has made progress, after a random extra moment.
        deadline = time.monotonic() + 30
        while proc.poll() is None and _progress(engine, ids) == before and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.25))
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        kills += 1
    # Phase 2: one healthy runner finishes everything.
    proc = _spawn(_runner_env(pg_url, model_server.url, state_dir), log)
    try:
        deadline = time.monotonic() + 120
        while not _all_done(engine, ids):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
    assert kills >= 20
    with engine.connect() as conn:
        resumed = sum(a.resumed for t in ids for a in list_attempts(conn, t))
    _assert_exact_history(engine, ids, state_dir, cycles)
    print(f"kills={kills} resumed_attempts={resumed}")
    engine.dispose()


@pytest.mark.slow
@pytest.mark.parametrize(("backend", "n_runners"), [("postgres", 2), ("postgres", 4), ("sqlite", 2)])
def test_concurrent_runners_never_run_a_step_twice(request, model_server, tmp_path, backend, n_runners):
    pg_url = request.getfixturevalue("pg_url" if backend == "postgres" else "sqlite_url")
    engine = make_engine(pg_url)
    migrate.upgrade(engine)
    state_dir = tmp_path / "state"
    state_dir.mkdir()
    cycles = 4
    ids = [submit(engine, {"cycles": cycles, "tool": "ledger"}) for _ in range(3 * n_runners)]
    log = tmp_path / "runners.log"
    env = _runner_env(pg_url, model_server.url, state_dir)
    env["DAYZERO_LEASE_S"] = "10"
    procs = [_spawn(env, log) for _ in range(n_runners)]
    try:
        deadline = time.monotonic() + 120
        while not _all_done(engine, ids):
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            p.wait(timeout=30)
    _assert_exact_history(engine, ids, state_dir, cycles)
    ledger = collections.Counter((state_dir / "ledger.log").read_text().split())
    assert set(ledger.values()) == {1}, "a side effect ran twice"
    with engine.connect() as conn:
        attempts = [a for t in ids for a in list_attempts(conn, t)]
    assert all(a.resumed == 0 for a in attempts)
    assert len({a.runner_id for a in attempts}) >= 2, "work was not spread over the runners"
    engine.dispose()

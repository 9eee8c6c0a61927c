"""A tool that is not idempotent and takes no idempotency key is never run twice: not after a
runner died while it may have been running, and not after it timed out."""

from __future__ import annotations

import json

import pytest

from orchestrator.runner.txn import StepTxn
from orchestrator.store import get_task, list_attempts, list_messages
from tests.orchestrator.conftest import submit


def test_in_doubt_side_effect_is_not_repeated(db, make_runner, state_dir):
    task_id = submit(db, {"cycles": 1, "tool": "charge"})
    dead = make_runner(lease_s=0.3)
    # Runner "dead" takes the task, runs the model step and commits the start of the charge
    # attempt, then vanishes before running it (as if SIGKILLed between commit and call).
    original = dead._execute_tool
    dead._execute_tool = lambda task, step, in_doubt: dead.stop()  # type: ignore[method-assign]
    dead.run_once()
    dead._execute_tool = original  # type: ignore[method-assign]
    survivor = make_runner(lease_s=5)
    survivor.run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
        tool_msg = next(m for m in list_messages(conn, task_id) if m["role"] == "tool")
    assert task.status == "SUCCEEDED"
    assert not (state_dir / "charges.log").exists()  # never executed by anyone
    assert [(a.attempt, a.status, a.resumed) for a in attempts] == [(1, "LOST", 1)]
    assert "unknown" in json.loads(tool_msg["content"])["error"]


def test_timed_out_side_effect_is_not_retried(db, make_runner, state_dir):
    task_id = submit(db, {"cycles": 1, "tool": "charge", "args": {"sleep_s": 2}})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
    assert [(a.attempt, a.status, a.error["kind"]) for a in attempts] == [(1, "FAILED", "timeout")]
    assert len((state_dir / "charges.log").read_text().split()) == 1


def test_steptxn_refuses_writes_after_the_lease_moved(db, make_runner):
    from orchestrator.runner.lease import LeaseLost
    from orchestrator.store import tasks_t

    task_id = submit(db, {"cycles": 1})
    runner = make_runner()
    with db.begin() as conn:
        conn.execute(tasks_t.update().where(tasks_t.c.id == task_id).values(lease_owner="someone-else"))
    task = runner._load(task_id)
    tx = StepTxn(task, runner.config.runner_id, 5.0)
    tx.event("step.started", {"step": 0})
    with db.connect() as conn, pytest.raises(LeaseLost):
        tx.commit(conn)
    with db.connect() as conn:
        assert get_task(conn, task_id).event_seq == 2  # created + ready; nothing written


def test_retryable_failure_of_a_side_effect_that_may_have_started_is_not_retried(db, make_runner, state_dir):
    # The failure says "retryable" but not that nothing happened: the charge may have gone
    # through, and the tool neither is idempotent nor takes a key, so it must not run again.
    task_id = submit(db, {"cycles": 1, "tool": "flaky_charge", "args": {"fail_times": 1}})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
        tool_msg = next(m for m in list_messages(conn, task_id) if m["role"] == "tool")
    assert task.status == "SUCCEEDED"
    assert [(a.attempt, a.status, a.error["kind"]) for a in attempts] == [(1, "FAILED", "retryable")]
    assert len((state_dir / "charges.log").read_text().split()) == 1
    assert json.loads(tool_msg["content"])["kind"] == "retryable"  # the model is told


def test_failure_before_a_side_effect_started_is_retried(db, make_runner, state_dir):
    # `started=False` travels from the tool through the job outcome to the runner's decision.
    task_id = submit(
        db, {"cycles": 1, "tool": "flaky_charge", "args": {"fail_times": 1, "before_start": True}}
    )
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
    assert [(a.attempt, a.status) for a in attempts] == [(1, "FAILED"), (2, "SUCCEEDED")]
    assert attempts[0].error["started"] is False
    assert len((state_dir / "charges.log").read_text().split()) == 1


def test_a_keyed_tool_retried_after_an_unknown_outcome_reuses_the_key(db, make_runner, state_dir):
    # Attempt 1 charges, then runs past its timeout: its outcome is unknown to the runner. The
    # retry must run under attempt 1's key, so the tool's own dedup keeps it to one charge.
    task_id = submit(db, {"cycles": 1, "tool": "keyed_charge"})
    make_runner().run_until_idle(timeout_s=30)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
    assert task.status == "SUCCEEDED"
    assert [(a.attempt, a.status) for a in attempts] == [(1, "FAILED"), (2, "SUCCEEDED")]
    assert attempts[0].error["kind"] == "timeout" and attempts[0].error["outcome_unknown"] is True
    runs = (state_dir / "keyed-runs.log").read_text().split()
    assert runs == [f"{task_id}:1:1", f"{task_id}:1:1"]  # the retry ran under the first key
    assert (state_dir / "charges.log").read_text().split() == [f"{task_id}:1:1"]


def test_a_keyed_tool_retried_after_a_known_failure_gets_a_fresh_key(db, make_runner, state_dir):
    from core.payloads import idempotency_key

    known = {"error": "connection refused", "kind": "retryable", "started": False}
    unknown = {**known, "outcome_unknown": True, "idempotency_key": "t:1:1"}
    assert idempotency_key("t", 1, 2, known) == "t:1:2"
    assert idempotency_key("t", 1, 3, unknown) == "t:1:1"
    assert idempotency_key("t", 1, 1, None) == "t:1:1"

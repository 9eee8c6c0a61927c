"""A task's last transaction claims the next task (PostgreSQL: one round trip and one commit for
both); a runner leaving its loop gives such a claim back; a last write that fails claims nothing.
On SQLite the runner claims each task on its own, with the same outcome."""

from __future__ import annotations

import pytest

from orchestrator.runner import lease
from orchestrator.runner.lease import LeaseLost
from orchestrator.runner.txn import StepTxn
from orchestrator.statemachine import TaskEvent
from orchestrator.store import get_task, list_events, tasks_t
from tests.orchestrator.conftest import submit


def test_a_tasks_last_transaction_claims_the_next_one(db, make_runner, monkeypatch):
    ids = [submit(db, {"cycles": 1, "tool": "echo"}) for _ in range(3)]
    claims: list[bool] = []  # one per separate claim: whether it found a task
    claim = lease.claim_with_state

    def counted(*args, **kwargs):
        state = claim(*args, **kwargs)
        claims.append(state is not None)
        return state

    monkeypatch.setattr("orchestrator.runner.loop.claim_with_state", counted)
    make_runner().run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert [get_task(conn, t).status for t in ids] == ["SUCCEEDED"] * 3
        for t in ids:  # each task's history is the same as when claimed on its own
            types = [e.type for e in list_events(conn, t)]
            assert types[:3] == ["task.created", "task.ready", "task.running"]
            assert types[-1] == "task.succeeded"
    if db.dialect.name == "postgresql":
        assert claims == [True, False]  # the first task; then each came with the one before
    else:
        assert claims == [True, True, True, False]


def test_leaving_the_loop_gives_the_claimed_next_task_back(db, make_runner):
    first = submit(db, {"cycles": 1, "tool": "echo"})
    second = submit(db, {"cycles": 1, "tool": "echo"})

    def first_done() -> bool:
        with db.connect() as conn:
            return get_task(conn, first).status == "SUCCEEDED"

    make_runner().run_until_idle(timeout_s=60, until=first_done)
    with db.connect() as conn:
        task = get_task(conn, second)
    assert task.status == "READY"  # not started
    assert task.lease_owner is None and task.lease_until is None  # and claimable by anyone now


def test_a_last_write_that_fails_claims_nothing(db, make_runner):
    ended = submit(db, {"cycles": 1})
    waiting = submit(db, {"cycles": 1})
    runner = make_runner()
    with db.begin() as conn:  # another runner holds the task now: the last write's fence fails
        conn.execute(tasks_t.update().where(tasks_t.c.id == ended).values(lease_owner="someone-else"))
    handed: list[object] = []
    tx = StepTxn(runner._load(ended), runner.config.runner_id, 5.0, claim_next=handed.append)
    tx.task_transition(TaskEvent.CANCEL, error={"kind": "cancelled", "message": "test"})
    with db.connect() as conn, pytest.raises(LeaseLost):
        tx.commit(conn)
    assert handed == []
    with db.connect() as conn:
        assert get_task(conn, ended).status == "READY"
        assert get_task(conn, waiting).lease_owner is None  # the claim went with the write

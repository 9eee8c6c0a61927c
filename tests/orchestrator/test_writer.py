"""`TaskWrite.commit` (the runner's one-transaction step write) and the claim: all or nothing, and
the connection is left as it was found (not in a transaction, not in autocommit)."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, func, select

from orchestrator.db.tables import attempts_t, events_t, messages_t, tasks_t
from orchestrator.runner.lease import claim_with_state
from orchestrator.tasks.writer import TaskWrite, lease_fence
from tests.orchestrator.conftest import submit


def _counts(db: Engine, task_id: str) -> tuple[int, int, int, int]:
    with db.connect() as conn:
        return (
            *(
                conn.execute(select(func.count()).select_from(t).where(t.c.task_id == task_id)).scalar_one()
                for t in (attempts_t, messages_t, events_t)
            ),
            conn.execute(select(tasks_t.c.event_seq).where(tasks_t.c.id == task_id)).scalar_one(),
        )


def _attempt_row(task_id: str, now) -> dict:
    return {
        "task_id": task_id,
        "step_index": 0,
        "attempt": 1,
        "status": "FAILED",
        "runner_id": "r1",
        "started_at": now,
        "finished_at": now,
    }


def _assert_connection_reusable(conn) -> None:
    assert not conn.in_transaction()
    if conn.dialect.name == "postgresql":
        assert conn.connection.driver_connection.autocommit is False
    with conn.begin():  # a plain transaction still works on it
        assert conn.exec_driver_sql("SELECT 1").scalar_one() == 1


def test_commit_writes_everything_or_nothing(db):
    task_id = submit(db, {"cycles": 1})
    with db.connect() as conn:
        state = claim_with_state(conn, "r1", 30)
        assert state is not None and state.task.id == task_id
        assert [m["role"] for m in state.messages] == ["user"] and state.steps == []
        _assert_connection_reusable(conn)
        before = _counts(db, task_id)

        # The fence does not hold (another runner's id): nothing is written, not even the insert.
        w = TaskWrite(task_id, lease_fence("someone-else"))
        w.insert(attempts_t, _attempt_row(task_id, w.now))
        w.event("step.started", {"step": 0})
        assert w.commit(conn) is None
        assert _counts(db, task_id) == before
        _assert_connection_reusable(conn)

        # A keyed UPDATE that misses its row: not all hit, and the insert beside it is undone too.
        w = TaskWrite(task_id, lease_fence("r1"))
        w.insert(attempts_t, _attempt_row(task_id, w.now))
        w.update_row(attempts_t, {"task_id": task_id, "step_index": 7, "attempt": 1}, status="LOST")
        w.event("step.started", {"step": 0})
        outcome = w.commit(conn)
        assert outcome is not None and not outcome.all_hit
        assert _counts(db, task_id) == before
        _assert_connection_reusable(conn)

        # Both hold: everything is written and the event numbered from the task's event_seq.
        w = TaskWrite(task_id, lease_fence("r1"))
        w.insert(attempts_t, _attempt_row(task_id, w.now))
        w.event("step.started", {"step": 0})
        w.event("step.note", {"step": 0})
        # The second event's history row also carries a step's outcome and message; None is NULL.
        extra = {"step_index": 0, "step_status": "SUCCEEDED", "attempt": 2, "started_at": w.now}
        w.attach(1, {**extra, "usage": {"prompt_tokens": 3}, "role": "tool", "content": "ok", "error": None})
        outcome = w.commit(conn)
        assert outcome is not None and outcome.all_hit and not outcome.cancel_requested
        assert outcome.event_seq == before[3] + 2
        assert _counts(db, task_id) == (before[0] + 1, before[1], before[2] + 2, before[3] + 2)
        _assert_connection_reusable(conn)
    e = events_t.c
    with db.connect() as conn:
        rows = conn.execute(
            select(e.type, e.step_index, e.step_status, e.attempt, e.started_at, e.usage, e.role, e.content)
            .where(e.task_id == task_id, e.seq > before[3])
            .order_by(e.seq)
        ).all()
        null_error = conn.execute(
            select(func.count()).where(e.task_id == task_id, e.error.is_(None), e.content.is_not(None))
        ).scalar_one()
    assert [tuple(r) for r in rows] == [
        ("step.started", None, None, None, None, None, None, None),
        ("step.note", 0, "SUCCEEDED", 2, w.now, {"prompt_tokens": 3}, "tool", "ok"),
    ]
    assert null_error == 1  # SQL NULL, not JSON null


def test_claim_with_nothing_claimable_returns_none(db):
    with db.connect() as conn:
        assert claim_with_state(conn, "r1", 30) is None
        _assert_connection_reusable(conn)


@pytest.mark.parametrize("failure", ["fence", "row"])
def test_before_commit_runs_only_when_the_write_would_commit(db, failure):
    """The `before_commit` hook (the crash failpoint) runs on the way to a commit, before it."""
    task_id = submit(db, {"cycles": 1})
    calls: list[tuple[int, ...]] = []
    with db.connect() as conn:
        claim_with_state(conn, "r1", 30)
        w = TaskWrite(task_id, lease_fence("r1" if failure == "row" else "other"))
        w.insert(attempts_t, _attempt_row(task_id, w.now))
        if failure == "row":
            w.update_row(attempts_t, {"task_id": task_id, "step_index": 9, "attempt": 1}, status="LOST")
        before = _counts(db, task_id)
        w.commit(conn, before_commit=lambda: calls.append(_counts(db, task_id)))
    # PostgreSQL sends statement and commit together, so the hook runs before either; SQLite
    # runs it between its statements and COMMIT, only when they all held.
    assert calls in ([before], []) and _counts(db, task_id) == before
    if db.dialect.name == "sqlite":
        assert calls == []


def test_claim_prepares_its_statements_again_after_they_were_deallocated(pg_url):
    """psycopg deallocates every prepared statement of a connection when it sees a ROLLBACK or a
    DEALLOCATE ALL; the claim then prepares its own again instead of failing."""
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    db = make_engine(pg_url)
    migrate.upgrade(db)
    ids = [submit(db, {"cycles": 1}) for _ in range(3)]
    with db.connect() as conn:
        dbapi = conn.connection.driver_connection
        first = claim_with_state(conn, "r1", 30)
        dbapi.execute("DEALLOCATE ALL")  # what psycopg sends after a ROLLBACK
        dbapi.commit()
        second = claim_with_state(conn, "r1", 30)
        with pytest.raises(RuntimeError), conn.begin():  # a transaction rolled back on this connection
            conn.exec_driver_sql("SELECT 1")
            raise RuntimeError
        third = claim_with_state(conn, "r1", 30)
        _assert_connection_reusable(conn)
    assert first and second and third
    assert sorted([first.task.id, second.task.id, third.task.id]) == sorted(ids)
    db.dispose()


def _wal_syncs(dbapi) -> int:
    """WAL fsyncs server-wide so far (this backend's pending counts flushed first: a backend
    reports them when it goes idle, between transactions)."""
    dbapi.execute("SELECT pg_stat_force_next_flush()")
    dbapi.commit()
    syncs = int(dbapi.execute("SELECT wal_sync FROM pg_stat_wal").fetchone()[0])
    dbapi.commit()
    return syncs


def test_commit_without_waiting_for_the_flush_skips_the_fsync(pg_url):
    """`wait_for_flush=False` commits without an fsync of its own (the WAL writer flushes it
    later); the default waits for one per commit. Counted by PostgreSQL's `pg_stat_wal`."""
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    db = make_engine(pg_url)
    migrate.upgrade(db)
    task_id = submit(db, {"cycles": 1})
    n = 40
    with db.connect() as conn:
        claim_with_state(conn, "r1", 30)
        dbapi = conn.connection.driver_connection
        dbapi.commit()
        synced: dict[bool, int] = {}
        for wait in (True, False):
            before = _wal_syncs(dbapi)
            for i in range(n):
                w = TaskWrite(task_id, lease_fence("r1"))
                w.event("step.note", {"i": i})
                outcome = w.commit(conn, wait_for_flush=wait)
                assert outcome is not None and outcome.all_hit
            synced[wait] = _wal_syncs(dbapi) - before
        _assert_connection_reusable(conn)
    assert _counts(db, task_id)[2] == 2 + 2 * n  # every commit landed (task.created, task.ready)
    assert synced[True] >= n
    assert synced[False] <= n // 4  # the WAL writer's (and any other backend's) fsyncs only
    db.dispose()


def test_the_claim_walks_the_claimable_index_with_a_long_queue(pg_url):
    """With 2,000 tasks queued the claim reads `ix_tasks_claimable` (migration 0007) in
    `next_run_at` order and sorts nothing (it used to scan and sort every claimable task), also
    before the table's statistics know of the queue, and it still takes the task that has waited
    longest."""
    import datetime as dt

    from psycopg import ClientCursor

    from orchestrator.config import Budgets
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine
    from orchestrator.runner import lease
    from orchestrator.tasks.create import NewTask, create_tasks

    db = make_engine(pg_url)
    migrate.upgrade(db)
    first = submit(db, {"cycles": 1})  # the oldest
    with db.begin() as conn:
        create_tasks(conn, [NewTask(tenant="t1", goal="script:{}") for _ in range(2000)], Budgets())
    with db.connect() as conn:
        dbapi = conn.connection.driver_connection
        plans = []
        for analyzed in (False, True):
            if analyzed:
                dbapi.execute("ANALYZE tasks")
                dbapi.commit()
            lease._ensure_prepared(dbapi)
            now = dt.datetime.now(dt.UTC)
            with ClientCursor(dbapi) as cur:
                cur.execute(lease.CLAIM_PLAN_SETTING)  # as in the claim's transaction
                cur.execute(
                    "EXPLAIN EXECUTE dayzero_claim(%s, %s, %s)", ("r1", now + dt.timedelta(seconds=30), now)
                )
                plans.append("\n".join(row[0] for row in cur.fetchall()))
            dbapi.commit()  # (not a rollback: psycopg deallocates every prepared statement after one)
        assert all("ix_tasks_claimable" in p and "Sort" not in p for p in plans), plans
        state = claim_with_state(conn, "r1", 30)
        assert state is not None and state.task.id == first
        _assert_connection_reusable(conn)
    db.dispose()

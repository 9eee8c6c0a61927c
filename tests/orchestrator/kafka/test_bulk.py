"""`bulk_create_tasks` writes exactly what `store.create_task` writes (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from orchestrator.api.bulk import bulk_create_tasks
from orchestrator.config import Budgets
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.store import IdempotencyConflict, NewTask, create_task, get_task, list_events, list_messages


@pytest.fixture(params=["sqlite", "postgres"])
def engine(request):
    e = make_engine(request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url"))
    migrate.upgrade(e)
    yield e
    e.dispose()


def _spec(key: str, **kw) -> NewTask:
    base = dict(
        tenant="acme",
        goal="do it",
        messages=[{"role": "user", "content": "before"}],
        system_prompt="sys",
        allowed_tools=["echo"],
        sampling={"temperature": 0.5},
        metadata={"k": "v", "n": 1},
        max_steps=3,
        idempotency_key=key,
        traceparent="00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
    )
    return NewTask(**{**base, **kw})


def _snapshot(conn, task_id):
    t = get_task(conn, task_id)._mapping
    skip = {"id", "idempotency_key", "deadline_at", "next_run_at", "created_at", "updated_at"}
    return (
        {k: v for k, v in t.items() if k not in skip},
        list_messages(conn, task_id),
        [(e.seq, e.type, e.payload) for e in list_events(conn, task_id)],
    )


def test_bulk_rows_equal_create_task_rows(engine):
    with engine.begin() as conn:
        one, _ = create_task(conn, _spec("single"), Budgets())
        out = bulk_create_tasks(
            conn, [_spec("b1"), _spec("b2"), _spec("b1"), _spec("b2", goal="other")], Budgets()
        )
    assert out[0][1] is True and out[1][1] is True
    assert out[2] == (out[0][0], False)  # a duplicate within the batch
    assert isinstance(out[3], IdempotencyConflict)
    with engine.begin() as conn:
        again = bulk_create_tasks(conn, [_spec("b1"), _spec("single")], Budgets())
        assert again == [(out[0][0], False), (one, False)]
        assert _snapshot(conn, out[0][0]) == _snapshot(conn, one)


def test_copy_path_rows_equal_create_task_rows(engine):
    with engine.begin() as conn:
        one, _ = create_task(conn, _spec("single"), Budgets())
        out = bulk_create_tasks(conn, [_spec(f"c{i}") for i in range(20)] + [_spec(None)], Budgets())
    assert all(o[1] for o in out)
    with engine.connect() as conn:
        assert all(_snapshot(conn, o[0]) == _snapshot(conn, one) for o in out[:20])
        assert get_task(conn, out[20][0]).idempotency_key is None


def test_a_task_without_trace_context_gets_a_new_trace(engine):
    from orchestrator.tracing import valid_traceparent

    with engine.begin() as conn:
        (out,) = bulk_create_tasks(conn, [_spec("t", traceparent=None)], Budgets())
        (bad,) = bulk_create_tasks(conn, [_spec("u", traceparent="garbage")], Budgets())
        assert valid_traceparent(get_task(conn, out[0]).traceparent)
        assert valid_traceparent(get_task(conn, bad[0]).traceparent)

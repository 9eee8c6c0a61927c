"""`create_tasks`, the one creation path of REST, Kafka and the CLI (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest

from orchestrator.config import Budgets
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.store import (
    IdempotencyConflict,
    NewTask,
    attachments_t,
    create_task,
    create_tasks,
    get_task,
    list_events,
    list_messages,
)


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


def test_rows_of_a_new_task(engine):
    with engine.begin() as conn:
        task_id, created = create_task(conn, _spec("single"), Budgets())
        task, messages, events = _snapshot(conn, task_id)
    assert created
    assert task["status"] == "READY" and task["event_seq"] == 2 and task["tenant"] == "acme"
    assert (task["max_steps"], task["max_tokens"]) == (3, Budgets().max_tokens)
    assert task["allowed_tools"] == ["echo"] and task["sampling"] == {"temperature": 0.5}
    assert task["metadata"] == {"k": "v", "n": 1}
    assert task["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "before"},
        {"role": "user", "content": "do it"},
    ]
    assert events == [
        (1, "task.created", {"tenant": "acme", "max_steps": 3, "max_tokens": Budgets().max_tokens}),
        (2, "task.ready", {"from": "PENDING", "to": "READY"}),
    ]


def test_batch_idempotency(engine):
    with engine.begin() as conn:
        one, _ = create_task(conn, _spec("single"), Budgets())
        out = create_tasks(
            conn, [_spec("b1"), _spec("b2"), _spec("b1"), _spec("b2", goal="other")], Budgets()
        )
    assert out[0][1] is True and out[1][1] is True
    assert out[2] == (out[0][0], False)  # a duplicate within the batch
    assert isinstance(out[3], IdempotencyConflict)
    with engine.begin() as conn:
        again = create_tasks(conn, [_spec("b1"), _spec("single")], Budgets())
        assert again == [(out[0][0], False), (one, False)]
        assert _snapshot(conn, out[0][0]) == _snapshot(conn, one)


def test_copy_path_rows_equal_insert_path_rows(engine):
    # One function, two ways to send rows: COPY from 8 tasks on (PostgreSQL), INSERT below.
    with engine.begin() as conn:
        one, _ = create_task(conn, _spec("single"), Budgets())
        out = create_tasks(conn, [_spec(f"c{i}") for i in range(20)] + [_spec(None)], Budgets())
    assert all(o[1] for o in out)
    with engine.connect() as conn:
        assert all(_snapshot(conn, o[0]) == _snapshot(conn, one) for o in out[:20])
        assert get_task(conn, out[20][0]).idempotency_key is None


def test_a_task_with_attachments_waits_for_preprocessing(engine):
    from orchestrator.clock import utcnow

    now = utcnow()
    with engine.begin() as conn:
        conn.execute(
            attachments_t.insert().values(
                id="att-1",
                tenant="acme",
                status="PENDING",
                media_type="image/png",
                size_bytes=1,
                sha256="0" * 64,
                created_at=now,
                updated_at=now,
            )
        )
        task_id, _ = create_task(conn, _spec("img", attachment_ids=["att-1"]), Budgets())
        task, messages, events = _snapshot(conn, task_id)
        owner = conn.execute(attachments_t.select().where(attachments_t.c.id == "att-1")).one().task_id
    assert task["status"] == "PREPROCESSING" and owner == task_id
    assert messages[-1]["content"] == [
        {"type": "text", "text": "do it"},
        {"type": "image_url", "image_url": {"url": "dayzero://attachments/att-1"}},
    ]
    assert events[1] == (2, "task.preprocessing", {"from": "PENDING", "to": "PREPROCESSING"})


def test_a_task_without_trace_context_gets_a_new_trace(engine):
    from orchestrator.tracing import valid_traceparent

    with engine.begin() as conn:
        (out,) = create_tasks(conn, [_spec("t", traceparent=None)], Budgets())
        (bad,) = create_tasks(conn, [_spec("u", traceparent="garbage")], Budgets())
        assert valid_traceparent(get_task(conn, out[0]).traceparent)
        assert valid_traceparent(get_task(conn, bad[0]).traceparent)

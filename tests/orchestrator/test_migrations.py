"""Alembic is the only way the schema changes: the migrated schema must equal the models."""

from __future__ import annotations

import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.db.models import Base
from orchestrator.db.types import UTCDateTime
from orchestrator.tasks.queries import message_dict

# The `tasks` and `steps` columns as revisions before 0011 have them (typed: SQLite returns text).
_OLD_TASKS = sa.table(
    "tasks",
    *(sa.column(c, sa.Integer()) for c in ("step_count", "event_seq", "prompt_tokens", "cached_tokens")),
    sa.column("completion_tokens", sa.Integer()),
    sa.column("lease_until", UTCDateTime()),
    sa.column("updated_at", UTCDateTime()),
    sa.column("status", sa.String()),
)
_OLD_STEPS = sa.table(
    "steps",
    sa.column("status", sa.String()),
    sa.column("finished_at", UTCDateTime()),
    sa.column("usage", sa.JSON()),
)


def test_migrated_schema_matches_models(db):
    with db.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []
    assert migrate.is_up_to_date(db)


def test_downgrade_to_base_and_back(db_url):
    engine = make_engine(db_url)
    migrate.upgrade(engine)
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()


def test_0004_moves_successful_attempts_onto_steps_and_back(db_url):
    """Attempt rows written before 0004 read the same after it, and the downgrade restores them."""
    import datetime as dt

    from sqlalchemy import text

    from orchestrator.tasks.queries import list_attempts

    engine = make_engine(db_url)
    migrate.upgrade(engine, "0003")
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(seconds=1)
    attempt = (
        "INSERT INTO step_attempts (task_id, step_index, attempt, status, runner_id, resumed, error, "
        "usage, started_at, finished_at) VALUES ('t', 0, :n, :status, :runner, :resumed, :error, :usage, "
        ":s, :f)"
    )
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO steps (task_id, step_index, kind, status, attempt_count, started_at, "
                "runner_id, created_at, finished_at) VALUES ('t', 0, 'model', 'SUCCEEDED', 2, :s, "
                "'r-start', :s, :f)"
            ),
            {"s": t0, "f": t1},
        )
        conn.execute(
            text(attempt),
            {
                "n": 1,
                "status": "FAILED",
                "runner": "r-a",
                "resumed": 0,
                "error": '{"kind": "x"}',
                "usage": None,
                "s": t0,
                "f": t0,
            },
        )
        conn.execute(
            text(attempt),
            {
                "n": 2,
                "status": "SUCCEEDED",
                "runner": "r-b",
                "resumed": 1,
                "error": None,
                "usage": '{"prompt_tokens": 3}',
                "s": t0,
                "f": t1,
            },
        )
    migrate.upgrade(engine)
    with engine.connect() as conn:
        rows = list_attempts(conn, "t")
        left = conn.execute(text("SELECT attempt, status FROM step_attempts")).all()
    assert [(a.attempt, a.status, a.runner_id, a.resumed) for a in rows] == [
        (1, "FAILED", "r-a", 0),
        (2, "SUCCEEDED", "r-b", 1),
    ]
    assert rows[0].error == {"kind": "x"} and rows[1].error is None
    assert rows[1].usage == {"prompt_tokens": 3} and rows[1].finished_at == t1
    assert [tuple(r) for r in left] == [(1, "FAILED")]
    migrate.downgrade(engine, "0003")
    with engine.connect() as conn:
        back = conn.execute(
            text("SELECT attempt, status, runner_id, resumed FROM step_attempts ORDER BY attempt")
        ).all()
    assert [tuple(r) for r in back] == [(1, "FAILED", "r-a", 0), (2, "SUCCEEDED", "r-b", 1)]
    engine.dispose()


def test_0008_moves_the_per_step_columns_with_their_values(db_url):
    """The rows written before 0008 (columns moved to the end on PostgreSQL) read the same after
    it and after its downgrade."""
    import datetime as dt

    from sqlalchemy import text

    from orchestrator.tasks.queries import get_task, list_attempts, list_steps

    engine = make_engine(db_url)
    migrate.upgrade(engine, "0007")
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    t1 = t0 + dt.timedelta(seconds=1)
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO tasks (id, tenant, status, max_steps, max_tokens, deadline_at, step_count, "
                "event_seq, prompt_tokens, cached_tokens, completion_tokens, cancel_requested, "
                "lease_owner, lease_until, next_run_at, created_at, updated_at) VALUES ('t', 'x', "
                "'RUNNING', 9, 99, :s, 3, 7, 11, 5, 2, false, 'r', :f, :s, :s, :f)"
            ),
            {"s": t0, "f": t1},
        )
        conn.execute(
            text(
                "INSERT INTO steps (task_id, step_index, kind, status, attempt_count, started_at, "
                "runner_id, created_at, finished_at, usage) VALUES ('t', 0, 'model', 'SUCCEEDED', 1, "
                ":s, 'r', :s, :f, :u)"
            ),
            {"s": t0, "f": t1, "u": '{"prompt_tokens": 11}'},
        )

    def read(at_head: bool) -> tuple:
        """At the head through the readers; before 0011 (a `steps` table, whose row held the
        successful attempt) through typed tables, as those readers then read them."""
        with engine.connect() as conn:
            if at_head:
                task = get_task(conn, "t")
                (step,) = list_steps(conn, "t")
                (attempt,) = list_attempts(conn, "t")
                attempt_usage = attempt.usage
            else:
                task = conn.execute(sa.select(*_OLD_TASKS.c)).one()
                step = conn.execute(sa.select(*_OLD_STEPS.c)).one()
                attempt_usage = step.usage
        return (
            (task.step_count, task.event_seq, task.prompt_tokens, task.cached_tokens),
            (task.completion_tokens, task.lease_until, task.updated_at, task.status),
            (step.status, step.finished_at, step.usage, attempt_usage),
        )

    before = read(at_head=False)
    assert before == (
        (3, 7, 11, 5),
        (2, t1, t1, "RUNNING"),
        ("SUCCEEDED", t1, {"prompt_tokens": 11}, {"prompt_tokens": 11}),
    )
    migrate.upgrade(engine)
    assert read(at_head=True) == before
    migrate.downgrade(engine, "0007")
    assert read(at_head=False) == before
    engine.dispose()


def test_0009_starts_the_relay_at_the_oldest_unpublished_event_and_back(db_url):
    """Events published before 0009 are not sent again after it, the first unpublished one is;
    the downgrade marks published exactly what lies below the mark."""
    import datetime as dt

    from sqlalchemy import text

    from orchestrator.kafka.relay import low_water

    engine = make_engine(db_url)
    migrate.upgrade(engine, "0008")
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    with engine.begin() as conn:
        for seq in (1, 2, 3, 4):
            conn.execute(
                text(
                    "INSERT INTO events (task_id, seq, type, created_at, published_at) "
                    "VALUES ('t', :q, 'task.created', :c, :p)"
                ),
                {"q": seq, "c": t0, "p": t0 if seq in (1, 2, 4) else None},
            )
        ids = [i for (i,) in conn.execute(text("SELECT id FROM events ORDER BY seq"))]
    migrate.upgrade(engine)
    with engine.connect() as conn:
        assert low_water(conn) == ids[2]  # seq 3, the oldest unpublished (4 is sent again too)
    migrate.downgrade(engine, "0008")
    with engine.connect() as conn:
        published = [
            p is not None for (p,) in conn.execute(text("SELECT published_at FROM events ORDER BY seq"))
        ]
    assert published == [True, True, False, False]
    engine.dispose()


def test_0011_moves_steps_and_their_messages_into_history_rows_and_back(db_url):
    """Steps and the messages they appended, written before 0011, read the same after it (through
    the readers: steps derived from history rows and the task row) and after its downgrade."""
    import datetime as dt

    from orchestrator.tasks.queries import list_attempts, list_events, list_messages, list_steps

    engine = make_engine(db_url)
    migrate.upgrade(engine, "0010")
    t = [dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i) for i in range(10)]
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": "echo", "arguments": f'{{"x": {i}}}'}}
        for i in (0, 1)
    ]
    step = {
        "kind": "model",
        "tool_name": None,
        "tool_call_id": None,
        "arguments": None,
        "attempt_count": 1,
        "next_attempt_at": None,
        "runner_id": "r1",
        "resumed": 0,
        "error": None,
        "usage": None,
        "finished_at": None,
    }

    def tool(i: int, **kw: object) -> dict:
        fn = calls[i]["function"]
        return {**step, "kind": "tool", "tool_name": fn["name"], "tool_call_id": calls[i]["id"],
                "arguments": fn["arguments"], **kw}  # fmt: skip

    usage = {"prompt_tokens": 5}
    err = {"error": "boom", "kind": "permanent"}
    steps = {
        # done: a model turn with two tool calls, one succeeded, one failed, the final answer
        "done": [
            {**step, "step_index": 0, "status": "SUCCEEDED", "usage": usage, "created_at": t[0],
             "started_at": t[0], "finished_at": t[1]},
            {**tool(0), "step_index": 1, "status": "SUCCEEDED", "created_at": t[1], "started_at": t[1],
             "finished_at": t[2], "resumed": 1},
            {**tool(1), "step_index": 2, "status": "FAILED", "created_at": t[1], "started_at": t[2],
             "finished_at": t[3], "error": err},
            {**step, "step_index": 3, "status": "SUCCEEDED", "usage": usage, "created_at": t[3],
             "started_at": t[3], "finished_at": t[4]},
        ],
        # open: the first tool call RUNNING at its second attempt, the second PENDING
        "open": [
            {**step, "step_index": 0, "status": "SUCCEEDED", "usage": usage, "created_at": t[0],
             "started_at": t[0], "finished_at": t[1]},
            {**tool(0), "step_index": 1, "status": "RUNNING", "attempt_count": 2, "created_at": t[1],
             "started_at": t[3], "runner_id": "r2"},
            {**tool(1), "step_index": 2, "status": "PENDING", "attempt_count": 0, "created_at": t[1],
             "started_at": None, "runner_id": None},
        ],
    }  # fmt: skip
    said = {
        "done": [
            {"role": "assistant", "content": None, "tool_calls": calls, "tool_call_id": None, "step_index": 0},
            {"role": "tool", "content": "ok", "tool_calls": None, "tool_call_id": "c0", "step_index": 1},
            {"role": "tool", "content": '{"error": "boom"}', "tool_calls": None, "tool_call_id": "c1",
             "step_index": 2},
            {"role": "assistant", "content": "done", "tool_calls": None, "tool_call_id": None, "step_index": 3},
        ],
        "open": [
            {"role": "assistant", "content": None, "tool_calls": calls, "tool_call_id": None, "step_index": 0},
        ],
    }  # fmt: skip
    old_steps = sa.table("steps", *(sa.column(c, _TYPES_0010[c]) for c in _TYPES_0010))
    messages = sa.table(
        "messages",
        *(
            sa.column(c, typ)
            for c, typ in _TYPES_0010.items()
            if c in ("task_id", "created_at", "tool_call_id")
        ),
        *(sa.column(c, sa.JSON()) for c in ("content", "tool_calls")),
        sa.column("seq", sa.Integer()),
        sa.column("role", sa.String()),
        sa.column("step_index", sa.Integer()),
    )
    with engine.begin() as conn:
        for tid, status in (("done", "SUCCEEDED"), ("open", "RUNNING")):
            conn.execute(
                sa.text(
                    "INSERT INTO tasks (id, tenant, status, max_steps, max_tokens, deadline_at, "
                    "next_run_at, created_at, updated_at, event_seq, step_count) "
                    "VALUES (:id, 'x', :st, 9, 99, :t, :t, :t, :t, 3, 1)"
                ),
                {"id": tid, "st": status, "t": t[0]},
            )
            goal = {"task_id": tid, "seq": 0, "role": "user", "content": "hi", "tool_calls": None}
            conn.execute(
                messages.insert(), [{**goal, "tool_call_id": None, "step_index": None, "created_at": t[0]}]
            )
            conn.execute(
                messages.insert(),
                [
                    {
                        **m,
                        "task_id": tid,
                        "seq": i + 1,
                        "created_at": steps[tid][m["step_index"]]["finished_at"],
                    }
                    for i, m in enumerate(said[tid])
                ],
            )
            conn.execute(old_steps.insert(), [{**s, "task_id": tid} for s in steps[tid]])
            for seq, typ in ((1, "task.created"), (2, "task.ready"), (3, "task.running")):
                conn.execute(
                    sa.text("INSERT INTO events (task_id, seq, type, created_at) VALUES (:id, :q, :ty, :t)"),
                    {"id": tid, "q": seq, "ty": typ, "t": t[0]},
                )
        conn.execute(
            sa.text(
                "INSERT INTO step_attempts (task_id, step_index, attempt, status, runner_id, started_at, "
                "finished_at) VALUES ('open', 1, 1, 'LOST', 'r1', :s, :f)"
            ),
            {"s": t[1], "f": t[2]},
        )
    goal_msg = {"role": "user", "content": "hi"}

    def transcript(tid: str) -> list[dict]:
        out = [goal_msg]
        for m in said[tid]:
            d = {"role": m["role"], "content": m["content"]}
            d.update({k: m[k] for k in ("tool_calls", "tool_call_id") if m[k]})
            out.append(d)
        return out

    migrate.upgrade(engine)
    with engine.connect() as conn:
        for tid in ("done", "open"):
            got = [{c: getattr(r, c) for c in _TYPES_0010 if c != "task_id"} for r in list_steps(conn, tid)]
            assert got == steps[tid]
            assert list_messages(conn, tid) == transcript(tid)
            assert [e.type for e in list_events(conn, tid)] == ["task.created", "task.ready", "task.running"]
        attempts = [(a.step_index, a.attempt, a.status, a.runner_id) for a in list_attempts(conn, "done")]
        assert attempts == [(0, 1, "SUCCEEDED", "r1"), (1, 1, "SUCCEEDED", "r1"), (3, 1, "SUCCEEDED", "r1")]
        assert [(a.step_index, a.attempt, a.status) for a in list_attempts(conn, "open")] == [
            (0, 1, "SUCCEEDED"),
            (1, 1, "LOST"),
        ]
    migrate.downgrade(engine, "0010")
    with engine.connect() as conn:
        for tid in ("done", "open"):
            back = conn.execute(
                sa.select(*old_steps.c).where(old_steps.c.task_id == tid).order_by(old_steps.c.step_index)
            ).all()
            assert [{c: getattr(r, c) for c in _TYPES_0010 if c != "task_id"} for r in back] == steps[tid]
            rows = conn.execute(
                sa.select(*messages.c).where(messages.c.task_id == tid).order_by(messages.c.seq)
            ).all()
            assert [r.seq for r in rows] == list(range(len(said[tid]) + 1))
            assert [r.step_index for r in rows] == [None, *(m["step_index"] for m in said[tid])]
            assert [message_dict(r) for r in rows] == transcript(tid)
            n = conn.execute(
                sa.text("SELECT count(*) FROM events WHERE task_id = :t"), {"t": tid}
            ).scalar_one()
            assert n == 3
    engine.dispose()


# The `steps` columns at 0010 (typed: SQLite returns text).
_TYPES_0010 = {
    "task_id": sa.String(),
    "step_index": sa.Integer(),
    "kind": sa.String(),
    "status": sa.String(),
    "tool_name": sa.String(),
    "tool_call_id": sa.String(),
    "arguments": sa.String(),
    "attempt_count": sa.Integer(),
    "next_attempt_at": UTCDateTime(),
    "started_at": UTCDateTime(),
    "runner_id": sa.String(),
    "resumed": sa.Integer(),
    "error": sa.JSON(),
    "usage": sa.JSON(),
    "created_at": UTCDateTime(),
    "finished_at": UTCDateTime(),
}

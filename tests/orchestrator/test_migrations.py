"""Alembic is the only way the schema changes: the migrated schema must equal the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.db.models import Base


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

    def read() -> tuple:
        with engine.connect() as conn:
            task = get_task(conn, "t")
            (step,) = list_steps(conn, "t")
            (attempt,) = list_attempts(conn, "t")
        return (
            (task.step_count, task.event_seq, task.prompt_tokens, task.cached_tokens),
            (task.completion_tokens, task.lease_until, task.updated_at, task.status),
            (step.status, step.finished_at, step.usage, attempt.usage),
        )

    before = read()
    assert before == (
        (3, 7, 11, 5),
        (2, t1, t1, "RUNNING"),
        ("SUCCEEDED", t1, {"prompt_tokens": 11}, {"prompt_tokens": 11}),
    )
    migrate.upgrade(engine)
    assert read() == before
    migrate.downgrade(engine, "0007")
    assert read() == before
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

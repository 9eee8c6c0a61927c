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

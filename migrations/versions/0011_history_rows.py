"""one history row per step: a step's outcome and message ride on its event; no `steps` table

Per step the runner wrote a `steps` row (inserted RUNNING, then updated), a `messages` row and
an `events` row, each with a 36-character task id in a heap row and a key: ~1,480 B of WAL per
step, 60.7 KB per 20-cycle task. Now the event that finishes a step (`step.succeeded` /
`step.failed`) carries that step's outcome (`step_index`, `step_status`, the last attempt's
`attempt`, `runner_id`, `resumed`, `usage`, `error`, `started_at`; it finished at `created_at`)
and the message the step appended (`role`, `content`, `tool_calls`, `tool_call_id`), and the
task row carries the open step (`open_*`, `next_step`): one heap row, two index entries and the
task row's HOT update per step. `messages` keeps the transcript a task was created with.
`orchestrator.tasks.history` derives the steps as the `steps` rows showed them.

The upgrade moves the existing rows: each task's open steps onto its task row, and its finished
steps and the messages its steps appended into history rows that carry no event (`type` NULL),
numbered below its events (`seq` -n .. -1, in step order: readers of events read `seq > 0`,
the relay passes over them). The downgrade rebuilds the `steps` rows and the messages from them.
SQLite: `events` is rebuilt (the `type` column becomes nullable) with AUTOINCREMENT, as in 0009.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-05
"""

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import sqlalchemy as sa
from alembic import op

from orchestrator.db.types import JSONType, UTCDateTime

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OPEN = "('PENDING', 'RUNNING', 'RETRY_WAIT')"

_TASK_COLUMNS = (
    sa.Column("open_started_at", UTCDateTime(), nullable=True),
    sa.Column("open_step", sa.Integer(), nullable=True),
    sa.Column("next_step", sa.Integer(), server_default=sa.text("0"), nullable=False),
    sa.Column("open_status", sa.String(length=16), nullable=True),
    sa.Column("open_attempt", sa.Integer(), server_default=sa.text("0"), nullable=False),
    sa.Column("open_runner_id", sa.String(length=64), nullable=True),
    sa.Column("open_next_attempt_at", UTCDateTime(), nullable=True),
)
_EVENT_COLUMNS = (
    sa.Column("started_at", UTCDateTime(), nullable=True),
    sa.Column("step_index", sa.Integer(), nullable=True),
    sa.Column("attempt", sa.Integer(), nullable=True),
    sa.Column("resumed", sa.Integer(), nullable=True),
    sa.Column("step_status", sa.String(length=16), nullable=True),
    sa.Column("runner_id", sa.String(length=64), nullable=True),
    sa.Column("usage", sa.JSON(), nullable=True),
    sa.Column("error", JSONType, nullable=True),
    sa.Column("role", sa.String(length=16), nullable=True),
    sa.Column("content", JSONType, nullable=True),
    sa.Column("tool_calls", JSONType, nullable=True),
    sa.Column("tool_call_id", sa.String(length=128), nullable=True),
)

# One history row per finished step and per message a step appended (a step's message and its
# outcome share a row), in step order, numbered -n .. -1 per task.
_LEGACY_ROWS = f"""
INSERT INTO events (task_id, seq, type, payload, created_at, started_at, step_index, attempt,
    resumed, step_status, runner_id, usage, error, role, content, tool_calls, tool_call_id)
SELECT task_id, rn - n - 1, NULL, NULL, created_at, started_at, step_index, attempt, resumed,
    step_status, runner_id, usage, error, role, content, tool_calls, tool_call_id
FROM (
    SELECT h.*, row_number() OVER (PARTITION BY h.task_id ORDER BY h.step_index, h.mseq) AS rn,
        count(*) OVER (PARTITION BY h.task_id) AS n
    FROM (
        SELECT s.task_id, s.step_index, m.seq AS mseq,
            COALESCE(s.finished_at, m.created_at, s.created_at) AS created_at,
            s.started_at, s.attempt_count AS attempt, s.resumed, s.status AS step_status,
            s.runner_id, s.usage, s.error, m.role, m.content, m.tool_calls, m.tool_call_id
        FROM steps s LEFT JOIN messages m
            ON m.task_id = s.task_id AND m.step_index = s.step_index
        WHERE s.status NOT IN {_OPEN}
        UNION ALL
        SELECT m.task_id, m.step_index, m.seq, m.created_at, NULL, NULL, NULL, NULL, NULL, NULL,
            NULL, m.role, m.content, m.tool_calls, m.tool_call_id
        FROM messages m
        WHERE m.step_index IS NOT NULL AND NOT EXISTS (
            SELECT 1 FROM steps s WHERE s.task_id = m.task_id AND s.step_index = m.step_index
            AND s.status NOT IN {_OPEN})
    ) h
) x
"""

# The lowest open step of each task (steps run in order; the later open ones are PENDING).
_FIRST_OPEN = f"SELECT min(o.step_index) FROM steps o WHERE o.task_id = tasks.id AND o.status IN {_OPEN}"
_OPEN_STEP = f"(SELECT s.{{col}} FROM steps s WHERE s.task_id = tasks.id AND s.step_index = ({_FIRST_OPEN}))"


def _events_batch() -> Any:
    sqlite = op.get_bind().dialect.name == "sqlite"
    return op.batch_alter_table(
        "events",
        recreate="always" if sqlite else "auto",
        table_kwargs={"sqlite_autoincrement": True} if sqlite else {},
    )


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch:
        for col in _TASK_COLUMNS:
            batch.add_column(
                sa.Column(col.name, col.type, nullable=col.nullable, server_default=col.server_default)
            )
    with _events_batch() as batch:
        batch.alter_column("type", existing_type=sa.String(length=64), nullable=True)
        for col in _EVENT_COLUMNS:
            batch.add_column(
                sa.Column(col.name, col.type, nullable=col.nullable, server_default=col.server_default)
            )
    sets = {
        "open_step": f"({_FIRST_OPEN})",
        "open_status": _OPEN_STEP.format(col="status"),
        "open_attempt": f"COALESCE({_OPEN_STEP.format(col='attempt_count')}, 0)",
        "open_started_at": _OPEN_STEP.format(col="started_at"),
        "open_runner_id": _OPEN_STEP.format(col="runner_id"),
        "open_next_attempt_at": _OPEN_STEP.format(col="next_attempt_at"),
        "next_step": "COALESCE((SELECT max(s.step_index) + 1 FROM steps s WHERE s.task_id = tasks.id), 0)",
    }
    op.execute(
        "UPDATE tasks SET "
        + ", ".join(f"{c} = {v}" for c, v in sets.items())
        + " WHERE EXISTS (SELECT 1 FROM steps s WHERE s.task_id = tasks.id)"
    )
    op.execute(_LEGACY_ROWS)
    op.execute("DELETE FROM messages WHERE step_index IS NOT NULL")
    op.drop_table("steps")


def downgrade() -> None:
    steps = op.create_table(
        "steps",
        sa.Column("task_id", sa.String(length=36), nullable=False),
        sa.Column("step_index", sa.Integer(), nullable=False),
        sa.Column("kind", sa.String(length=8), nullable=False),
        sa.Column("tool_name", sa.String(length=128), nullable=True),
        sa.Column("tool_call_id", sa.String(length=128), nullable=True),
        sa.Column("arguments", sa.Text(), nullable=True),
        sa.Column("attempt_count", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("next_attempt_at", UTCDateTime(), nullable=True),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("runner_id", sa.String(length=64), nullable=True),
        sa.Column("resumed", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("error", JSONType, nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("usage", sa.JSON(), nullable=True),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.PrimaryKeyConstraint("task_id", "step_index"),
    )
    _rebuild_steps_and_messages(op.get_bind(), steps)
    op.execute("DELETE FROM events WHERE type IS NULL")
    with _events_batch() as batch:
        for col in reversed(_EVENT_COLUMNS):
            batch.drop_column(col.name)
        batch.alter_column("type", existing_type=sa.String(length=64), nullable=False)
    with op.batch_alter_table("tasks") as batch:
        for col in reversed(_TASK_COLUMNS):
            batch.drop_column(col.name)


def _rebuild_steps_and_messages(conn: sa.Connection, steps: sa.Table) -> None:
    """The `steps` rows as `tasks.history` derives them, and the steps' messages back in
    `messages` after each task's initial transcript."""
    from orchestrator.tasks.history import derive_steps

    def cols(*names: str) -> list[sa.ColumnClause[Any]]:
        return [sa.column(n, typ) for n, typ in _TYPES.items() if n in names]

    said_cols = ("role", "content", "tool_calls", "tool_call_id", "step_index", "created_at")
    events = sa.table("events", *cols("task_id", "seq", *(c.name for c in _EVENT_COLUMNS), "created_at"))
    messages = sa.table("messages", *cols("task_id", "seq", *said_cols))
    tasks = sa.table(
        "tasks", *cols("id", "created_at", "updated_at", "finished_at", *(c.name for c in _TASK_COLUMNS))
    )
    attempts = sa.table("step_attempts", *cols("task_id", "step_index", "attempt", "started_at"))
    e = events.c
    by_task: dict[str, list[Any]] = {}
    for h in conn.execute(
        sa.select(*events.c)
        .where(sa.or_(e.step_status.is_not(None), e.role.is_not(None)))
        .order_by(e.task_id, e.seq)
    ):
        by_task.setdefault(h.task_id, []).append(h)
    starts: dict[str, dict[int, Any]] = {}
    for a in conn.execute(sa.select(*attempts.c).where(attempts.c.attempt == 1)):
        starts.setdefault(a.task_id, {})[a.step_index] = a.started_at
    known = {t.id: t for t in conn.execute(sa.select(*tasks.c))}
    for task_id in set(by_task) | {t.id for t in known.values() if t.next_step}:
        history = by_task.get(task_id, [])
        task = known.get(task_id) or _orphan(task_id, history)
        rows = derive_steps(task, history, starts.get(task_id, {}))
        if rows:
            conn.execute(
                sa.insert(steps),
                [
                    {
                        **{c.name: getattr(r, c.name) for c in steps.c if c.name != "created_at"},
                        "created_at": r.created_at or r.started_at or r.finished_at or task.created_at,
                    }
                    for r in rows
                ],
            )
        said = [h for h in history if h.role is not None]
        if said:
            first = conn.execute(
                sa.select(sa.func.coalesce(sa.func.max(messages.c.seq) + 1, 0)).where(
                    messages.c.task_id == task_id
                )
            ).scalar_one()
            conn.execute(
                sa.insert(messages),
                [
                    {
                        "task_id": task_id,
                        "seq": first + i,
                        "role": h.role,
                        "content": h.content,
                        "tool_calls": h.tool_calls,
                        "tool_call_id": h.tool_call_id,
                        "step_index": h.step_index,
                        "created_at": h.created_at,
                    }
                    for i, h in enumerate(said)
                ],
            )


# The types of the columns the downgrade reads and writes (lightweight tables: no reflection).
_TYPES: dict[str, Any] = {
    "id": sa.String(36),
    "task_id": sa.String(36),
    "seq": sa.BigInteger(),
    "updated_at": UTCDateTime(),
    "finished_at": UTCDateTime(),
    "created_at": UTCDateTime(),
    "attempt": sa.Integer(),
    **{c.name: c.type for c in (*_TASK_COLUMNS, *_EVENT_COLUMNS)},
}


def _orphan(task_id: str, history: list[Any]) -> SimpleNamespace:
    """History rows whose task row is gone: their finished steps only."""
    done = [h.step_index for h in history if h.step_index is not None]
    return SimpleNamespace(
        id=task_id,
        next_step=max(done) + 1 if done else 0,
        open_step=None,
        open_status=None,
        created_at=history[0].created_at if history else None,
    )

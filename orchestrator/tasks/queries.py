"""Reads of tasks, steps, attempts, messages, events (and the outbox past a cursor) and attachments:
every query in one place.

Functions take an open `Connection` and never write; a tenant, where given, scopes the read
(another tenant's task is indistinguishable from a missing one).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, Select, func, null, or_, select, text, union_all

from orchestrator.db.tables import attachments_t, attempts_t, events_t, messages_t, steps_t, tasks_t
from orchestrator.kafka.outbox_cursor import OutboxCursor
from orchestrator.statemachine import StepStatus, TaskStatus
from orchestrator.tasks.errors import TaskNotFound

UNFINISHED = (TaskStatus.PREPROCESSING, TaskStatus.READY, TaskStatus.RUNNING, TaskStatus.WAITING)


def get_task(conn: Connection, task_id: str, tenant: str | None = None) -> Row[Any]:
    q = select(tasks_t).where(tasks_t.c.id == task_id)
    if tenant is not None:
        q = q.where(tasks_t.c.tenant == tenant)
    row = conn.execute(q).first()
    if row is None:
        raise TaskNotFound(task_id)
    return row


def list_steps(conn: Connection, task_id: str) -> list[Row[Any]]:
    return list(
        conn.execute(select(steps_t).where(steps_t.c.task_id == task_id).order_by(steps_t.c.step_index))
    )


def list_attempts(conn: Connection, task_id: str) -> list[Row[Any]]:
    """Every finished attempt, in order: the failed/lost ones from `step_attempts`, and each
    succeeded step's successful attempt, which is kept on its step row (`models.Step`)."""
    a, s = attempts_t.c, steps_t.c
    failed = select(
        a.task_id,
        a.step_index,
        a.attempt,
        a.status,
        a.runner_id,
        a.resumed,
        a.error,
        a.usage,
        a.started_at,
        a.finished_at,
    ).where(a.task_id == task_id)
    succeeded = select(
        s.task_id,
        s.step_index,
        s.attempt_count,
        s.status,
        s.runner_id,
        s.resumed,
        null().label("error"),
        s.usage,
        s.started_at,
        s.finished_at,
    ).where(s.task_id == task_id, s.status == StepStatus.SUCCEEDED.value)
    q = union_all(failed, succeeded).subquery()
    return list(conn.execute(select(q).order_by(q.c.step_index, q.c.attempt)))


def list_messages(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(select(messages_t).where(messages_t.c.task_id == task_id).order_by(messages_t.c.seq))
    return [message_dict(r) for r in rows]


def message_dict(r: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"role": r.role, "content": r.content}
    if r.tool_calls:
        m["tool_calls"] = r.tool_calls
    if r.tool_call_id:
        m["tool_call_id"] = r.tool_call_id
    return m


def list_events(conn: Connection, task_id: str, after_seq: int = 0) -> list[Row[Any]]:
    return list(
        conn.execute(
            select(events_t)
            .where(events_t.c.task_id == task_id, events_t.c.seq > after_seq)
            .order_by(events_t.c.seq)
        )
    )


# The snapshot's bounds as integers: xids below `xmin` have finished, from `xmax` on not started.
_SNAPSHOT_PG = text(
    "SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint, "
    "pg_snapshot_xmax(pg_current_snapshot())::text::bigint"
)
_HOLES_PER_READ = 100  # id ranges per look-up of the holes


def read_events_past(
    conn: Connection, cursor: OutboxCursor, query: Select[Any], limit: int
) -> tuple[list[Any], list[Any], int, int]:
    """The outbox read of the relay and of the SSE feed's tail (`query`: a select of `events`
    columns in id order): the events past the cursor's frontier, the holes now filled, and the
    bounds of the one snapshot all were read in, for `OutboxCursor.advance` (PostgreSQL: a
    REPEATABLE READ transaction; SQLite: its one writer never leaves a hole that a later
    commit fills, so `xmin == xmax`)."""
    pg = conn.dialect.name == "postgresql"
    if pg:
        conn = conn.execution_options(isolation_level="REPEATABLE READ")
    with conn.begin():
        xmin, xmax = conn.execute(_SNAPSHOT_PG).one() if pg else (0, 0)
        new = list(conn.execute(query.where(events_t.c.id > cursor.frontier).limit(limit)))
        late: list[Any] = []
        for i in range(0, len(cursor.holes), _HOLES_PER_READ):
            ranges = [events_t.c.id.between(h.lo, h.hi) for h in cursor.holes[i : i + _HOLES_PER_READ]]
            late += conn.execute(query.where(or_(*ranges)))
    return new, late, xmin, xmax


def max_event_id(conn: Connection) -> int:
    """The highest event id committed so far (0 when there is none)."""
    return int(conn.execute(select(func.coalesce(func.max(events_t.c.id), 0))).scalar_one())


def list_attachments(conn: Connection, task_id: str) -> list[Row[Any]]:
    return list(
        conn.execute(
            select(attachments_t)
            .where(attachments_t.c.task_id == task_id)
            .order_by(attachments_t.c.created_at)
        )
    )


def has_unfinished_tasks(conn: Connection) -> bool:
    q = select(tasks_t.c.id).where(tasks_t.c.status.in_([s.value for s in UNFINISHED]))
    return conn.execute(q.limit(1)).first() is not None


@dataclass(frozen=True, slots=True)
class TaskState:
    """Everything a runner reads about a task it has just claimed."""

    task: Any  # the tasks row
    messages: list[dict[str, Any]]
    steps: list[Any]  # step rows in order
    attachments: list[Any]


def task_state(conn: Connection, task_id: str, task: Any = None) -> TaskState:
    """The task's state; `task` is its row when the caller has it already (the claim returns it)."""
    return TaskState(
        task=task if task is not None else get_task(conn, task_id),
        messages=list_messages(conn, task_id),
        steps=list_steps(conn, task_id),
        attachments=list_attachments(conn, task_id),
    )


# The same reads as `task_state`, as SQL text for PostgreSQL's one-message claim
# (`runner.lease.claim_with_state`): `{task}` is an expression that yields the task's id.
STATE_SQL_PG = (
    "SELECT * FROM messages WHERE task_id = ({task}) ORDER BY seq",
    "SELECT * FROM steps WHERE task_id = ({task}) ORDER BY step_index",
    "SELECT * FROM attachments WHERE task_id = ({task}) ORDER BY created_at",
)

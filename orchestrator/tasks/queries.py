"""Reads of tasks, steps, attempts, messages, events (and the outbox past a cursor) and attachments:
every query in one place. Steps have no table of their own: they are derived from the task's
history rows and its task row (`tasks.history`).

Functions take an open `Connection` and never write; a tenant, where given, scopes the read
(another tenant's task is indistinguishable from a missing one).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, Select, func, literal, null, or_, select, text, union_all

from orchestrator.db.tables import attachments_t, attempts_t, events_t, messages_t, tasks_t
from orchestrator.kafka.outbox_cursor import OutboxCursor
from orchestrator.statemachine import StepStatus, TaskStatus
from orchestrator.tasks.errors import TaskNotFound
from orchestrator.tasks.history import StepRow, derive_steps, open_step_state, open_steps

UNFINISHED = (TaskStatus.PREPROCESSING, TaskStatus.READY, TaskStatus.RUNNING, TaskStatus.WAITING)


def get_task(conn: Connection, task_id: str, tenant: str | None = None) -> Row[Any]:
    q = select(tasks_t).where(tasks_t.c.id == task_id)
    if tenant is not None:
        q = q.where(tasks_t.c.tenant == tenant)
    row = conn.execute(q).first()
    if row is None:
        raise TaskNotFound(task_id)
    return row


# The columns of a history row that describe a step (its outcome, its model turn's tool calls).
_STEP_COLS = (
    events_t.c.step_index,
    events_t.c.step_status,
    events_t.c.attempt,
    events_t.c.runner_id,
    events_t.c.resumed,
    events_t.c.usage,
    events_t.c.error,
    events_t.c.started_at,
    events_t.c.created_at,
    events_t.c.role,
    events_t.c.tool_calls,
)


def list_steps(conn: Connection, task_id: str) -> list[StepRow]:
    """Every step of the task in order, as `tasks.history.StepRow` (the old `steps` rows)."""
    task = conn.execute(select(tasks_t).where(tasks_t.c.id == task_id)).first()
    if task is None:
        return []
    history = conn.execute(
        select(*_STEP_COLS)
        .where(
            events_t.c.task_id == task_id,
            or_(events_t.c.step_status.is_not(None), events_t.c.role == "assistant"),
        )
        .order_by(events_t.c.seq)
    )
    a = attempts_t.c
    first_starts = dict(
        conn.execute(select(a.step_index, a.started_at).where(a.task_id == task_id, a.attempt == 1)).all()
    )
    return derive_steps(task, history, first_starts)


def step_state(conn: Connection, task_id: str, step_index: int) -> tuple[Any, str, int] | None:
    """(the task row, the step's status, its attempt count), or None when there is no such step."""
    task = conn.execute(select(tasks_t).where(tasks_t.c.id == task_id)).first()
    if task is None or not 0 <= step_index < task.next_step:
        return None
    if task.open_step is not None and step_index >= task.open_step:
        return task, *open_step_state(task, step_index)
    done = conn.execute(
        select(events_t.c.step_status, events_t.c.attempt).where(
            events_t.c.task_id == task_id,
            events_t.c.step_index == step_index,
            events_t.c.step_status.is_not(None),
        )
    ).first()
    return None if done is None else (task, done.step_status, done.attempt or 0)


def list_attempts(conn: Connection, task_id: str) -> list[Row[Any]]:
    """Every finished attempt, in order: the failed/lost ones from `step_attempts`, and each
    succeeded step's successful attempt, which is kept on its history row (`models.Event`)."""
    a, e = attempts_t.c, events_t.c
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
        e.task_id,
        e.step_index,
        e.attempt,
        e.step_status,
        e.runner_id,
        e.resumed,
        null().label("error"),
        e.usage,
        e.started_at,
        e.created_at,
    ).where(e.task_id == task_id, e.step_status == StepStatus.SUCCEEDED.value)
    q = union_all(failed, succeeded).subquery()
    return list(conn.execute(select(q).order_by(q.c.step_index, q.c.attempt)))


def list_messages(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    """The transcript: the goal (`messages`), then what the steps appended (their history rows)."""
    return [message_dict(r) for r in _transcript(conn, task_id)]


def task_goals(conn: Connection, task_ids: list[str]) -> dict[str, str]:
    """Each task's goal as text: the last user message it was created with (its images left out)."""
    if not task_ids:
        return {}
    m = messages_t.c
    rows = conn.execute(
        select(m.task_id, m.content)
        .where(m.task_id.in_(task_ids), m.role == "user")
        .order_by(m.task_id, m.seq)
    )
    return {r.task_id: _text_of(r.content) for r in rows}  # later seqs overwrite earlier ones


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    parts = content if isinstance(content, list) else []
    return " ".join(p["text"] for p in parts if isinstance(p, dict) and isinstance(p.get("text"), str))


def _transcript(conn: Connection, task_id: str, after: int | None = None) -> list[Any]:
    """The transcript rows (`part` 0: the goal; 1: history rows), or with `after` only the
    history rows past that `seq` (what a runner that keeps the rest reads: `runner.transcripts`)."""
    m, e = messages_t.c, events_t.c
    first = (
        conn.execute(
            select(m.role, m.content, m.tool_calls, m.tool_call_id, m.step_index, literal(0).label("part"))
            .where(m.task_id == task_id)
            .order_by(m.seq)
        )
        if after is None
        else ()
    )
    q = select(e.role, e.content, e.tool_calls, e.tool_call_id, e.step_index, literal(1).label("part")).where(
        e.task_id == task_id, e.role.is_not(None)
    )
    if after is not None:  # (migrated history rows have negative `seq`: no bound without one)
        q = q.where(e.seq > after)
    later = conn.execute(q.order_by(e.seq))
    return [*first, *later]


def message_dict(r: Any) -> dict[str, Any]:
    m: dict[str, Any] = {"role": r.role, "content": r.content}
    if r.tool_calls:
        m["tool_calls"] = r.tool_calls
    if r.tool_call_id:
        m["tool_call_id"] = r.tool_call_id
    return m


def list_events(conn: Connection, task_id: str, after_seq: int = 0) -> list[Row[Any]]:
    """The task's events after `after_seq` (>= 0: the rows migrated without an event have
    negative seqs)."""
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
    steps: list[StepRow]  # the open steps, in order
    attachments: list[Any]
    # the step index of each message (None: the goal's), and how many are the goal's
    message_steps: list[int | None] = field(default_factory=list)
    goal_messages: int = 0


def task_state(conn: Connection, task_id: str, task: Any = None) -> TaskState:
    """The task's state; `task` is its row when the caller has it already (the claim returns it)."""
    task = task if task is not None else get_task(conn, task_id)
    return state_of(task, _transcript(conn, task_id), list_attachments(conn, task_id))


def transcript_rows(conn: Connection, task_id: str, after: int | None = None) -> list[Any]:
    """`_transcript` for the runner's claim (the rows, with `part` and `step_index`)."""
    return _transcript(conn, task_id, after)


def state_of(task: Any, transcript: list[Any], attachments: list[Any]) -> TaskState:
    """`TaskState` from the task row, its transcript rows (with `step_index`) and attachments."""
    return TaskState(
        task=task,
        messages=[message_dict(m) for m in transcript],
        steps=open_steps(task, transcript),
        attachments=attachments,
        message_steps=[m.step_index if getattr(m, "part", 1) else None for m in transcript],
        goal_messages=sum(1 for m in transcript if getattr(m, "part", 1) == 0),
    )


# The same reads as `task_state`, as SQL text for PostgreSQL's one-message claim
# (`runner.lease.claim_with_state`): `{task}` is an expression that yields the task's id.
# A runner that keeps transcripts (`runner.transcripts`) names the positions it has in the
# transaction-local setting `dayzero.known` (a JSON object, task id -> `seq`): for a task named
# there only the history rows past its position are read, and not the goal.
_KNOWN_PG = "nullif(current_setting('dayzero.known', true), '')::jsonb"
STATE_SQL_PG = (
    "SELECT role, content, tool_calls, tool_call_id, step_index, part FROM ("
    "SELECT 0 AS part, seq, role, content, tool_calls, tool_call_id, step_index FROM messages "
    f"WHERE task_id = ({{task}}) AND NOT coalesce({_KNOWN_PG} ? ({{task}}), false) UNION ALL "
    "SELECT 1, seq, role, content, tool_calls, tool_call_id, step_index FROM events "
    "WHERE task_id = ({task}) AND role IS NOT NULL "
    f"AND seq > coalesce(({_KNOWN_PG} ->> ({{task}}))::bigint, {-(2**62)})) m ORDER BY part, seq",
    "SELECT * FROM attachments WHERE task_id = ({task}) ORDER BY created_at",
)

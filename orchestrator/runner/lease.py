"""Leases on tasks: claim (`FOR UPDATE SKIP LOCKED` on PostgreSQL; the single-writer
`BEGIN IMMEDIATE` lock on SQLite) and renew; a lease ends with the task or expires. Every write a runner makes is fenced on its
lease, so a runner that lost its lease cannot change the task any more."""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import Connection, Row, or_, select, update

from orchestrator.clock import utcnow
from orchestrator.db.tables import tasks_t
from orchestrator.statemachine import RUNNABLE_TASK_STATUSES, TaskStatus
from orchestrator.tasks.queries import STATE_SQL_PG, TaskState, message_dict, task_state

# A runner also takes tasks whose attachments still need preprocessing.
CLAIMABLE = sorted({*RUNNABLE_TASK_STATUSES, TaskStatus.PREPROCESSING})


class LeaseLost(Exception):
    """Another runner holds the task now (our lease expired); stop working on it."""


def claim_next_task(conn: Connection, runner_id: str, lease_s: float) -> Row[Any] | None:
    """Take the lease of the runnable task that has waited longest; returns its row (after the
    claim), or None when there is none."""
    now = utcnow()
    candidate = (
        select(tasks_t.c.id)
        .where(
            tasks_t.c.status.in_([s.value for s in CLAIMABLE]),
            tasks_t.c.next_run_at <= now,
            or_(tasks_t.c.lease_until.is_(None), tasks_t.c.lease_until < now),
        )
        .order_by(tasks_t.c.next_run_at)
        .limit(1)
    )
    if conn.dialect.name == "postgresql":
        candidate = candidate.with_for_update(skip_locked=True)
    return conn.execute(
        update(tasks_t)
        .where(tasks_t.c.id == candidate.scalar_subquery())
        .values(lease_owner=runner_id, lease_until=now + dt.timedelta(seconds=lease_s))
        .returning(*tasks_t.c)
    ).first()


def renew_lease(conn: Connection, task_id: str, runner_id: str, lease_s: float) -> None:
    res = conn.execute(
        update(tasks_t)
        .where(tasks_t.c.id == task_id, tasks_t.c.lease_owner == runner_id)
        .values(lease_until=utcnow() + dt.timedelta(seconds=lease_s))
    )
    if res.rowcount != 1:
        raise LeaseLost(task_id)


_CLAIM_PG = (
    "UPDATE tasks SET lease_owner = %(owner)s, lease_until = %(until)s WHERE id = ("
    "SELECT id FROM tasks WHERE status = ANY(%(statuses)s) AND next_run_at <= %(now)s "
    "AND (lease_until IS NULL OR lease_until < %(now)s) ORDER BY next_run_at LIMIT 1 "
    "FOR UPDATE SKIP LOCKED) RETURNING *"
)
# The task this claim took: its owner and this claim's exact expiry (an older lease of this
# runner on another task, given up without release, has an earlier one).
_CLAIMED_PG = "SELECT id FROM tasks WHERE lease_owner = %(owner)s AND lease_until = %(until)s"


def claim_with_state(conn: Connection, runner_id: str, lease_s: float) -> TaskState | None:
    """`claim_next_task`, then `task_state` of the claimed task, inside the caller's transaction.

    On PostgreSQL the five statements go in one pipeline (one round trip) as SQL text that
    psycopg prepares; elsewhere they run one by one."""
    if conn.dialect.name != "postgresql":
        row = claim_next_task(conn, runner_id, lease_s)
        return None if row is None else task_state(conn, row.id, task=row)
    from psycopg.rows import namedtuple_row

    now = utcnow()
    params = {
        "owner": runner_id,
        "until": now + dt.timedelta(seconds=lease_s),
        "now": now,
        "statuses": [s.value for s in CLAIMABLE],
    }
    dbapi = conn.connection.driver_connection
    with dbapi.pipeline(), dbapi.cursor(row_factory=namedtuple_row) as cur:
        # UTC datetimes, as the `UTCDateTime` columns read them on the SQLAlchemy path
        cur.execute("SET LOCAL TimeZone = 'UTC'")
        cur.execute(_CLAIM_PG, params, prepare=True)
        cursors = []
        for sql in STATE_SQL_PG:
            c = dbapi.cursor(row_factory=namedtuple_row)
            c.execute(sql.format(task=_CLAIMED_PG), params, prepare=True)
            cursors.append(c)
        task = cur.fetchone()
        messages, steps, attachments = (c.fetchall() for c in cursors)
    for c in cursors:
        c.close()
    if task is None:
        return None
    return TaskState(
        task=task, messages=[message_dict(m) for m in messages], steps=steps, attachments=attachments
    )

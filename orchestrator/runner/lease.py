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

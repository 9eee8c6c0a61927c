"""Leases on tasks: claim (`FOR UPDATE SKIP LOCKED` on PostgreSQL; the single-writer
`BEGIN IMMEDIATE` lock on SQLite) and renew; a lease ends with the task or expires. Every write a runner makes is fenced on its
lease, so a runner that lost its lease cannot change the task any more."""

from __future__ import annotations

import datetime as dt
import json
import weakref
from typing import Any

from sqlalchemy import Connection, Row, or_, select, update

from orchestrator.clock import utcnow
from orchestrator.db.engine import autocommit_driver
from orchestrator.db.models import CLAIMABLE_SQL
from orchestrator.db.tables import tasks_t
from orchestrator.runner.transcripts import TranscriptCache, history_rows
from orchestrator.statemachine import CLAIMABLE_TASK_STATUSES
from orchestrator.tasks.history import open_steps
from orchestrator.tasks.queries import (
    STATE_SQL_PG,
    TaskState,
    list_attachments,
    state_of,
    transcript_rows,
)

CLAIMABLE = sorted(CLAIMABLE_TASK_STATUSES)


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


# The claim also records the claimed id in a transaction-local setting that the reads of its
# state then use (`STATE_SQL_PG`): statements sent together cannot pass values to one another,
# and finding the row again by its lease would scan the whole table three times per claim.
# The status filter is literal (`CLAIMABLE_SQL`), the predicate of the partial index
# `ix_tasks_claimable` (migration 0007): the claim walks that index in `next_run_at` order and
# stops at the first row it can lock, instead of sorting every claimable task.
_CLAIM_PG = (
    "UPDATE tasks SET lease_owner = $1, lease_until = $2 WHERE id = ("
    f"SELECT id FROM tasks WHERE {CLAIMABLE_SQL} AND next_run_at <= $3 "
    "AND (lease_until IS NULL OR lease_until < $3) ORDER BY next_run_at LIMIT 1 "
    "FOR UPDATE SKIP LOCKED) RETURNING *, set_config('dayzero.claimed_task', id, true) AS claimed"
)
_CLAIMED_PG = "current_setting('dayzero.claimed_task', true)"
# Server-side prepared statements (planning them at every claim cost ~0.5 ms of a ~1 ms claim),
# created on each connection before its first claim (`_ensure_prepared`).
_PREPARED_PG = {
    "dayzero_claim": f"PREPARE dayzero_claim(text, timestamptz, timestamptz) AS {_CLAIM_PG}",
    **{
        f"dayzero_claim_state{i}": f"PREPARE dayzero_claim_state{i} AS {sql.format(task=_CLAIMED_PG)}"
        for i, sql in enumerate(STATE_SQL_PG)
    },
}
# The claim's plan must walk `ix_tasks_claimable` in order. Statistics of a queue table lag its
# growth (3,000 tasks queued at once read as a few rows), and then the planner sorted every
# claimable task instead (2.7 ms at 3,000 queued; 0.06 ms in index order).
CLAIM_PLAN_SETTING = "SET LOCAL enable_sort = off"
# UTC datetimes, as the `UTCDateTime` columns read them on the SQLAlchemy path; no wait for the
# commit's WAL flush (see `claim_with_state`).
_CLAIM_TXN_PG = "; ".join(
    (
        "BEGIN",
        "SET LOCAL dayzero.known = %(known)s",  # the transcripts this runner keeps (`STATE_SQL_PG`)
        "SET LOCAL TimeZone = 'UTC'",
        "SET LOCAL synchronous_commit = off",
        CLAIM_PLAN_SETTING,
        "EXECUTE dayzero_claim(%(owner)s, %(until)s, %(now)s)",
        "SET LOCAL enable_sort = on",  # the reads' own plans (attachments are sorted by time)
        *(f"EXECUTE dayzero_claim_state{i}" for i in range(len(STATE_SQL_PG))),
        "COMMIT",
    )
)
# Driver connections known to hold the statements of `_PREPARED_PG`.
_prepared: weakref.WeakSet[Any] = weakref.WeakSet()


def _ensure_prepared(dbapi: Any) -> None:
    """Prepare what this connection lacks of `_PREPARED_PG` (one look-up per connection)."""
    if dbapi in _prepared:
        return
    from psycopg import ClientCursor

    have = {
        name
        for (name,) in dbapi.execute(
            "SELECT name FROM pg_prepared_statements WHERE name = ANY(%s)", (list(_PREPARED_PG),)
        )
    }
    missing = [sql for name, sql in _PREPARED_PG.items() if name not in have]
    if missing:
        with ClientCursor(dbapi) as cur:
            cur.execute("; ".join(missing))
    _prepared.add(dbapi)


def _send_claim(dbapi: Any, params: dict[str, Any]) -> list[list[Any]]:
    """The claim's one message; the row sets of the claim and the reads."""
    from psycopg import ClientCursor, errors
    from psycopg.pq import ExecStatus
    from psycopg.rows import namedtuple_row

    for retry in (False, True):
        _ensure_prepared(dbapi)
        with ClientCursor(dbapi, row_factory=namedtuple_row) as cur:
            try:
                cur.execute(_CLAIM_TXN_PG, params)
            except errors.InvalidSqlStatementName:
                # psycopg deallocates every prepared statement of a connection (ours included)
                # when it sees a ROLLBACK there: prepare them again, once.
                dbapi.rollback()
                _prepared.discard(dbapi)
                if retry:
                    raise
                continue
            results = []
            while True:
                if cur.pgresult is not None and cur.pgresult.status == ExecStatus.TUPLES_OK:
                    results.append(cur.fetchall())  # the claim and the reads
                if not cur.nextset():
                    return results
    raise AssertionError("unreachable")


def claim_with_state(
    conn: Connection, runner_id: str, lease_s: float, cache: TranscriptCache | None = None
) -> TaskState | None:
    """`claim_next_task`, then `task_state` of the claimed task, as one transaction of its own on
    `conn` (which must not be in a transaction); None when nothing was claimable.

    On PostgreSQL BEGIN, the claim, the reads and COMMIT go in one message (one round
    trip), and the commit does not wait for its WAL flush:
    nothing depends on the claim before the task's next commit, which is durable and flushes the
    WAL up to it (a claim lost in a server crash is a lease never held). Elsewhere the statements
    run one by one inside `BEGIN IMMEDIATE`.

    `cache`: the transcripts this runner keeps; for a task found there only the history rows past
    its position are read (`runner.transcripts`), and where they do not fit, the whole
    transcript is read again in a second query."""
    known = cache.known() if cache is not None else {}
    if conn.dialect.name != "postgresql":
        with conn.begin():
            row = claim_next_task(conn, runner_id, lease_s)
            if row is None:
                return None
            rows = transcript_rows(conn, row.id, known.get(row.id))
            state = _with_cache(conn, row, rows, list_attachments(conn, row.id), cache, known)
        return state
    now = utcnow()
    params = {
        "owner": runner_id,
        "until": now + dt.timedelta(seconds=lease_s),
        "now": now,
        "known": json.dumps(known),
    }
    # One simple-query message holding the whole transaction, parameters bound client-side:
    # one round trip and little client work (psycopg's pipeline mode costs more here).
    with autocommit_driver(conn, _CLAIM_TXN_PG, params) as dbapi:
        results = _send_claim(dbapi, params)
    claimed, transcript, attachments = results
    task = claimed[0] if claimed else None
    if task is None:
        return None
    return _with_cache(conn, task, transcript, attachments, cache, known)


def _with_cache(
    conn: Connection,
    task: Any,
    rows: list[Any],
    attachments: list[Any],
    cache: TranscriptCache | None,
    known: dict[str, int],
) -> TaskState:
    """The claimed task's state from the rows read: all of its transcript, or (a task in `known`)
    the rows past the cached position, joined to the cached transcript where they fit."""
    if cache is None or task.id not in known:
        if cache is not None:
            cache.stats["miss"] += 1
        return state_of(task, rows, attachments)
    entry = cache.extend(task, rows)
    if entry is None:  # they do not fit: read it all (one more query, a transaction of its own)
        if conn.in_transaction():
            return state_of(task, transcript_rows(conn, task.id), attachments)
        with conn.begin():
            return state_of(task, transcript_rows(conn, task.id), attachments)
    return TaskState(
        task=task,
        messages=entry.messages,
        steps=open_steps(task, history_rows(entry.messages, entry.steps)),
        attachments=attachments,
        message_steps=entry.steps,
        goal_messages=entry.goal_messages,
    )

"""The one transaction writer: a task row update, row writes and outbox events, fenced, at once.

Every change of a task after its creation goes through `TaskWrite`: the runner's step
transactions (`runner.txn.StepTxn`, fenced on the runner's lease), and the transitions made by
whoever holds no lease (`transition_task`: cancellation, fenced on the expected status). A
transaction is a short list of row writes (`RowWrite`: an INSERT, or an UPDATE keyed on its
primary key that must hit exactly one row), one fenced UPDATE of the task row, and the outbox
events numbered from the task's `event_seq`; an event's history row may carry more columns
(`attach`: the outcome of the step it finishes and the message that step appended). `apply()`
runs inside the caller's transaction and never commits; `commit()` (the runner's steps) is a
transaction of its own.

PostgreSQL: the whole list becomes ONE statement of data-modifying CTEs, rendered as SQL text
once per *shape* (which tables, which columns) and cached, so the hot path neither builds nor
compiles SQLAlchemy constructs; psycopg prepares the repeated text server-side. The statement
returns whether the fence held, the hit count of each keyed UPDATE, and `cancel_requested`;
for `commit()` it aborts itself instead when either check fails, so it runs in autocommit mode
and BEGIN + statement + COMMIT are one round trip.
SQLite: the same writes through SQLAlchemy Core, one statement at a time (inside the caller's
transaction, which on SQLite is `BEGIN IMMEDIATE`).
"""

from __future__ import annotations

import datetime as dt
import functools
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Connection, Table, insert, update
from sqlalchemy.dialects import postgresql
from sqlalchemy.exc import DBAPIError

from orchestrator.clock import utcnow
from orchestrator.db.engine import autocommit_driver
from orchestrator.db.tables import attachments_t, attempts_t, events_t, messages_t, tasks_t
from orchestrator.statemachine import TaskEvent, TaskStatus, TaskTransition
from orchestrator.tasks.errors import StaleTransition
from orchestrator.tracing import record_transition

# The tables a transaction may write besides `tasks` (their SQL names render the statement).
_TABLES: dict[str, Table] = {t.name: t for t in (attempts_t, messages_t, attachments_t)}


@dataclass(frozen=True, slots=True)
class Fence:
    """The condition on the task row that makes the transaction valid: `column = value`."""

    column: str  # "lease_owner" (a runner holds the task) or "status" (nobody does)
    value: str


def lease_fence(runner_id: str) -> Fence:
    return Fence("lease_owner", runner_id)


def status_fence(expected: str) -> Fence:
    return Fence("status", expected)


@dataclass(frozen=True, slots=True)
class RowWrite:
    table: Table
    values: Mapping[str, Any]
    where: Mapping[str, Any] | None = None  # None: INSERT; else an UPDATE that must hit one row


@dataclass(frozen=True, slots=True)
class Outcome:
    event_seq: int
    cancel_requested: bool
    all_hit: bool
    traceparent: str | None


class TaskWrite:
    """Collects one transaction's writes to one task; `apply(conn)` sends them."""

    def __init__(self, task_id: str, fence: Fence, now: dt.datetime | None = None):
        self.task_id = task_id
        self.fence = fence
        self.now = now or utcnow()
        self.events: list[tuple[str, dict[str, Any]]] = []
        self.extras: dict[int, Mapping[str, Any]] = {}  # event position -> more history columns
        self.task_values: dict[str, Any] = {}
        self.writes: list[RowWrite] = []

    def event(self, typ: str, payload: dict[str, Any]) -> None:
        self.events.append((typ, payload))

    def attach(self, position: int, columns: Mapping[str, Any]) -> None:
        """More columns of the history row of the event at `position` (`models.Event`)."""
        self.extras[position] = columns

    def set_task(self, **values: Any) -> None:
        self.task_values.update(values)

    def insert(self, table: Table, row: Mapping[str, Any]) -> None:
        self.writes.append(RowWrite(table, row))

    def update_row(self, table: Table, where: Mapping[str, Any], **values: Any) -> None:
        """An UPDATE of one row (keyed by `where`) that must hit exactly that row."""
        self.writes.append(RowWrite(table, values, dict(where)))

    def apply(self, conn: Connection) -> Outcome | None:
        """Send the writes inside the caller's transaction; None when the fence did not hold
        (then nothing was written by this statement and the caller must roll back)."""
        apply = _apply_postgres if conn.dialect.name == "postgresql" else _apply_sequential
        return apply(conn, self)

    def commit(
        self,
        conn: Connection,
        before_commit: Callable[[], None] = lambda: None,
        *,
        wait_for_flush: bool = True,
    ) -> Outcome | None:
        """Send the writes as a transaction of their own on `conn` (not in a transaction) and
        commit them; None when the fence did not hold, `all_hit` False when a keyed UPDATE
        missed its row: in both cases nothing was written. `before_commit` runs once the commit
        is the next thing to happen (a failpoint: dying there must lose the whole transaction).
        PostgreSQL: one statement and one round trip; with `wait_for_flush=False` the commit
        returns before its WAL is on disk (`synchronous_commit = off` for this transaction only:
        for a transaction that nothing outside the database acts on before the task's next
        durable commit, which flushes it too). SQLite: `BEGIN IMMEDIATE`, the statements,
        COMMIT."""
        if conn.dialect.name == "postgresql":
            return _commit_postgres(conn, self, before_commit, wait_for_flush)
        with conn.begin() as txn:
            outcome = _apply_sequential(conn, self)
            if outcome is None or not outcome.all_hit:
                txn.rollback()
                return outcome
            before_commit()
        return outcome


def transition_task(
    conn: Connection,
    task_id: str,
    expected: str,
    event: TaskEvent,
    *,
    values: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
) -> TaskStatus:
    """Move a task no runner holds from `expected` by `event`, with its outbox event, in the
    caller's transaction. Raises `IllegalTransition` / `StaleTransition` (row not `expected`)."""
    w = TaskWrite(task_id, status_fence(expected))
    t = TaskTransition(expected, event, w.now, dict(payload or {}))
    w.set_task(updated_at=w.now, **(values or {}))
    w.set_task(**t.row)
    w.event(t.event_type, t.event_payload)
    outcome = w.apply(conn)
    if outcome is None:
        raise StaleTransition(f"task {task_id} is no longer {expected}")
    record_transition("task", task_id, expected, t.new.value, outcome.traceparent)
    return t.new


# -- PostgreSQL: one statement --------------------------------------------------------------
# One encoder for the hot path (`json.dumps` with options builds a new one per call).
_dumps = json.JSONEncoder(separators=(",", ":"), default=str).encode


@functools.cache
def _json_columns(table: Table) -> frozenset[str]:
    return frozenset(c.name for c in table.columns if isinstance(c.type, JSON))


def _db_value(table: Table, column: str, value: Any) -> Any:
    # None in a JSON column is JSON `null`, as SQLAlchemy's JSON type writes it on the other path.
    if column in _json_columns(table):
        return _dumps(value)
    return value


@functools.cache
def _pg_json_casts(table: Table) -> dict[str, str]:
    """The PostgreSQL type of each JSON column (`jsonb`, or `json` for `types.JSONText`)."""
    pg = postgresql.dialect()
    return {
        c.name: "jsonb" if isinstance(c.type.dialect_impl(pg), postgresql.JSONB) else "json"
        for c in table.columns
        if isinstance(c.type, JSON)
    }


@functools.cache
def _pg_type(table: Table, column: str) -> str:
    """The column's PostgreSQL type, as a cast for a bare parameter."""
    return str(table.c[column].type.compile(dialect=postgresql.dialect()))


def _placeholder(table: Table, column: str, name: str) -> str:
    cast = _pg_json_casts(table).get(column)
    return f"%({name})s::{cast}" if cast else f"%({name})s"


@functools.lru_cache(maxsize=256)
def _render_pg(
    fence_column: str,
    task_cols: tuple[str, ...],
    shapes: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None], ...],
    n_events: int,
    checked: bool,
    wait_for_flush: bool = True,
    extras: tuple[tuple[str, ...], ...] = (),
) -> str:
    """SQL text for one transaction shape (cached: a few dozen shapes cover every step).

    `checked`: the statement aborts itself (`dayzero_write_check`, migration 0006) when the fence
    did not hold or a keyed UPDATE missed its row, so it may run as its own transaction.
    `wait_for_flush=False` adds a transaction-local `synchronous_commit = off` (read at COMMIT)."""
    sets = ", ".join(f"{c} = {_placeholder(tasks_t, c, f't_{c}')}" for c in task_cols)
    ctes = [
        f"t AS (UPDATE tasks SET {sets}{', ' if sets else ''}event_seq = event_seq + %(t_n)s "
        f"WHERE id = %(t_id)s AND {fence_column} = %(t_fence)s "
        "RETURNING event_seq, cancel_requested, traceparent)"
    ]
    checks = []
    for i, (tname, cols, where) in enumerate(shapes):
        table = _TABLES[tname]
        if where is None:
            vals = ", ".join(_placeholder(table, c, f"w{i}_{c}") for c in cols)
            ctes.append(f"w{i} AS (INSERT INTO {tname} ({', '.join(cols)}) VALUES ({vals}))")
        else:
            sets_i = ", ".join(f"{c} = {_placeholder(table, c, f'w{i}_{c}')}" for c in cols)
            cond = " AND ".join(f"{c} = %(k{i}_{c})s" for c in where)
            ctes.append(f"w{i} AS (UPDATE {tname} SET {sets_i} WHERE {cond} RETURNING 1)")
            checks.append(f"(SELECT count(*) FROM w{i})")
    if n_events:
        payload_cast = _pg_json_casts(events_t)["payload"]
        # `extras[j]`: the extra columns row j has a value for; every row lists every extra column
        # of the statement, a literal NULL where it has none (fewer parameters to bind and plan).
        extra_cols = sorted({c for cols in extras for c in cols})
        has = [extras[j] if j < len(extras) else () for j in range(n_events)]
        rows = ", ".join(
            f"(%(e{j}_off)s::int, %(e{j}_type)s::varchar, %(e{j}_payload)s::{payload_cast}"
            + "".join(
                f", {f'%(e{j}_{c})s' if c in has[j] else 'NULL'}::{_pg_type(events_t, c)}" for c in extra_cols
            )
            + ")"
            for j in range(n_events)
        )
        names = "".join(f", {c}" for c in extra_cols)
        values = "".join(f", v.{c}" for c in extra_cols)
        ctes.append(
            f"ev AS (INSERT INTO events (task_id, seq, type, payload, created_at{names}) "
            f"SELECT %(t_id)s, t.event_seq + v.off, v.type, v.payload, %(e_now)s{values} "
            f"FROM t CROSS JOIN (VALUES {rows}) AS v(off, type, payload{names}))"
        )
    hits = " + ".join(checks) if checks else "0"
    check = (
        f"dayzero_write_check((SELECT count(*) FROM t) = 1, ({hits})::bigint, {len(checks)})"
        if checked
        else "true"
    )
    no_flush = "" if wait_for_flush else ", set_config('synchronous_commit', 'off', true)"
    return (
        "WITH " + ",\n".join(ctes) + "\nSELECT (SELECT event_seq FROM t), (SELECT cancel_requested FROM t), "
        f"(SELECT traceparent FROM t), {hits}, {len(checks)}, {check}{no_flush}"
    )


def _pg_statement(w: TaskWrite, *, checked: bool, wait_for_flush: bool = True) -> tuple[str, dict[str, Any]]:
    params: dict[str, Any] = {
        "t_n": len(w.events),
        "t_id": w.task_id,
        "t_fence": w.fence.value,
        "e_now": w.now,
    }
    for c, v in w.task_values.items():
        params[f"t_{c}"] = _db_value(tasks_t, c, v)
    shapes = []
    for i, rw in enumerate(w.writes):
        cols = tuple(rw.values)
        for c in cols:
            params[f"w{i}_{c}"] = _db_value(rw.table, c, rw.values[c])
        where = None
        if rw.where is not None:
            where = tuple(rw.where)
            for c in where:
                params[f"k{i}_{c}"] = rw.where[c]
        shapes.append((rw.table.name, cols, where))
    n = len(w.events)
    extras = []
    for j, (typ, payload) in enumerate(w.events):
        params[f"e{j}_off"] = j - n + 1
        params[f"e{j}_type"] = typ
        params[f"e{j}_payload"] = _dumps(payload)
        # None is SQL NULL here (no message content, no usage, ...): it reads back as None, as
        # JSON `null` would, in fewer bytes.
        present = tuple(c for c, v in w.extras.get(j, {}).items() if v is not None)
        for c in present:
            params[f"e{j}_{c}"] = _db_value(events_t, c, w.extras[j][c])
        extras.append(present)
    sql = _render_pg(
        w.fence.column, tuple(w.task_values), tuple(shapes), n, checked, wait_for_flush, tuple(extras)
    )
    return sql, params


def _apply_postgres(conn: Connection, w: TaskWrite) -> Outcome | None:
    sql, params = _pg_statement(w, checked=False)
    seq, cancel, traceparent, hits, expected, _ = conn.exec_driver_sql(sql, params).one()
    if seq is None:
        return None
    return Outcome(seq, bool(cancel), hits == expected, traceparent)


# SQLSTATEs raised by `dayzero_write_check` (migration 0006).
_FENCE_MISSED, _ROW_MISSED = "DZ001", "DZ002"


def _commit_postgres(
    conn: Connection, w: TaskWrite, before_commit: Callable[[], None], wait_for_flush: bool
) -> Outcome | None:
    """The checked statement as a transaction of its own (autocommit), prepared: BEGIN, the
    statement and COMMIT cost one round trip (and the WAL flush). Sent on the driver connection:
    SQLAlchemy's per-statement machinery was ~17% of a step's client time under cProfile."""
    import psycopg

    sql, params = _pg_statement(w, checked=True, wait_for_flush=wait_for_flush)
    before_commit()  # nothing is sent yet: dying here leaves the previous committed state
    try:
        with autocommit_driver(conn, sql, params) as dbapi:
            row = dbapi.execute(sql, params, prepare=True).fetchone()
    except DBAPIError as exc:
        state = exc.orig.sqlstate if isinstance(exc.orig, psycopg.Error) else None
        if state == _FENCE_MISSED:
            return None
        if state == _ROW_MISSED:
            return Outcome(0, False, False, None)
        raise
    assert row is not None
    seq, cancel, traceparent = row[:3]
    return Outcome(seq, bool(cancel), True, traceparent)


# -- SQLite (and any other database): plain statements ---------------------------------------
def _apply_sequential(conn: Connection, w: TaskWrite) -> Outcome | None:
    row = conn.execute(
        update(tasks_t)
        .where(tasks_t.c.id == w.task_id, tasks_t.c[w.fence.column] == w.fence.value)
        .values(**w.task_values, event_seq=tasks_t.c.event_seq + len(w.events))
        .returning(tasks_t.c.event_seq, tasks_t.c.cancel_requested, tasks_t.c.traceparent)
    ).first()
    if row is None:
        return None
    all_hit = True
    for rw in w.writes:
        if rw.where is None:
            conn.execute(insert(rw.table).values(**rw.values))
        else:
            cond = [rw.table.c[c] == v for c, v in rw.where.items()]
            all_hit &= conn.execute(update(rw.table).where(*cond).values(**rw.values)).rowcount == 1
    first = row.event_seq - len(w.events) + 1
    for i, (typ, p) in enumerate(w.events):
        # One INSERT per row: NULL, not JSON `null`, for the extra columns a row does not carry.
        extra = {c: v for c, v in w.extras.get(i, {}).items() if v is not None}
        conn.execute(
            insert(events_t).values(
                task_id=w.task_id, seq=first + i, type=typ, payload=p, created_at=w.now, **extra
            )
        )
    return Outcome(row.event_seq, bool(row.cancel_requested), all_hit, row.traceparent)

"""Applying one step's writes: a single round trip on PostgreSQL, plain statements on SQLite.

A step's transaction is a short list of row writes (`RowWrite`: an INSERT, or an UPDATE keyed on
its primary key that must hit exactly one row), one fenced UPDATE of the task row, and the
outbox events numbered from the task's `event_seq`.

PostgreSQL: the whole list becomes ONE statement of data-modifying CTEs, rendered as SQL text
once per *shape* (which tables, which columns) and cached, so the hot path neither builds nor
compiles SQLAlchemy constructs; psycopg prepares the repeated text server-side. The statement
returns whether the lease held, the hit count of each keyed UPDATE, and `cancel_requested`.
SQLite: the same writes through SQLAlchemy Core, one statement at a time inside BEGIN IMMEDIATE.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import JSON, Connection, Table, insert, update

from orchestrator.store import events_t, tasks_t

# (event_seq after the write, cancel_requested), or None when the lease was lost.
FenceResult = tuple[int, bool] | None


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


@functools.cache
def _json_columns(table: Table) -> frozenset[str]:
    return frozenset(c.name for c in table.columns if isinstance(c.type, JSON))


def _db_value(table: Table, column: str, value: Any) -> Any:
    # None in a JSON column is JSON `null`, as SQLAlchemy's JSON type writes it on the other path.
    if column in _json_columns(table):
        return json.dumps(value, separators=(",", ":"), default=str)
    return value


def _placeholder(table: Table, column: str, name: str) -> str:
    return f"%({name})s::jsonb" if column in _json_columns(table) else f"%({name})s"


@functools.lru_cache(maxsize=256)
def _render_pg(
    task_cols: tuple[str, ...],
    shapes: tuple[tuple[str, tuple[str, ...], tuple[str, ...] | None], ...],
    n_events: int,
) -> str:
    """SQL text for one transaction shape (cached: a few dozen shapes cover every step)."""
    sets = ", ".join(f"{c} = %(t_{c})s" for c in task_cols)
    ctes = [
        f"t AS (UPDATE tasks SET {sets}{', ' if sets else ''}event_seq = event_seq + %(t_n)s "
        "WHERE id = %(t_id)s AND lease_owner = %(t_owner)s RETURNING event_seq, cancel_requested)"
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
        rows = ", ".join(
            f"(%(e{j}_off)s::int, %(e{j}_type)s::varchar, %(e{j}_payload)s::jsonb)" for j in range(n_events)
        )
        ctes.append(
            "ev AS (INSERT INTO events (task_id, seq, type, payload, created_at) "
            "SELECT %(t_id)s, t.event_seq + v.off, v.type, v.payload, %(e_now)s "
            f"FROM t CROSS JOIN (VALUES {rows}) AS v(off, type, payload))"
        )
    hits = " + ".join(checks) if checks else "0"
    return (
        "WITH " + ",\n".join(ctes) + "\n"
        f"SELECT (SELECT event_seq FROM t), (SELECT cancel_requested FROM t), {hits}, {len(checks)}"
    )


_TABLES: dict[str, Table] = {}


def apply_postgres(
    conn: Connection,
    task_id: str,
    runner_id: str,
    task_values: Mapping[str, Any],
    seq_increment: int,
    writes: Sequence[RowWrite],
    events: Sequence[tuple[str, dict[str, Any]]],
    now: Any,
) -> Outcome | None:
    """Run the transaction's single statement; None when the lease was lost."""
    params: dict[str, Any] = {"t_n": seq_increment, "t_id": task_id, "t_owner": runner_id, "e_now": now}
    for c, v in task_values.items():
        params[f"t_{c}"] = _db_value(tasks_t, c, v)
    shapes = []
    for i, w in enumerate(writes):
        _TABLES.setdefault(w.table.name, w.table)
        cols = tuple(w.values)
        for c in cols:
            params[f"w{i}_{c}"] = _db_value(w.table, c, w.values[c])
        where = None
        if w.where is not None:
            where = tuple(w.where)
            for c in where:
                params[f"k{i}_{c}"] = w.where[c]
        shapes.append((w.table.name, cols, where))
    n = len(events)
    for j, (typ, payload) in enumerate(events):
        params[f"e{j}_off"] = j - n + 1
        params[f"e{j}_type"] = typ
        params[f"e{j}_payload"] = json.dumps(payload, separators=(",", ":"), default=str)
    sql = _render_pg(tuple(task_values), tuple(shapes), n)
    seq, cancel, hits, expected = conn.exec_driver_sql(sql, params).one()
    if seq is None:
        return None
    return Outcome(event_seq=seq, cancel_requested=bool(cancel), all_hit=hits == expected)


def apply_sequential(
    conn: Connection,
    task_id: str,
    runner_id: str,
    task_values: Mapping[str, Any],
    seq_increment: int,
    writes: Sequence[RowWrite],
    events: Sequence[tuple[str, dict[str, Any]]],
    now: Any,
) -> Outcome | None:
    """The same writes as plain statements (SQLite); None when the lease was lost."""
    row = conn.execute(
        update(tasks_t)
        .where(tasks_t.c.id == task_id, tasks_t.c.lease_owner == runner_id)
        .values(**task_values, event_seq=tasks_t.c.event_seq + seq_increment)
        .returning(tasks_t.c.event_seq, tasks_t.c.cancel_requested)
    ).first()
    if row is None:
        return None
    all_hit = True
    for w in writes:
        if w.where is None:
            conn.execute(insert(w.table).values(**w.values))
        else:
            cond = [w.table.c[c] == v for c, v in w.where.items()]
            all_hit &= conn.execute(update(w.table).where(*cond).values(**w.values)).rowcount == 1
    if events:
        first = row.event_seq - len(events) + 1
        conn.execute(
            insert(events_t),
            [
                {"task_id": task_id, "seq": first + i, "type": typ, "payload": p, "created_at": now}
                for i, (typ, p) in enumerate(events)
            ],
        )
    return Outcome(event_seq=row.event_seq, cancel_requested=bool(row.cancel_requested), all_hit=all_hit)

"""Many tasks in one transaction: what `store.create_task` does per task, in a few statements.

Used for plain tasks (no attachments) by Kafka ingest (a poll's batch) and by REST (one task: four
statements instead of create_task's six, and no re-read for the response). The rows are
exactly those `create_task` writes — task READY (PENDING → ADMIT, checked against the state
machine), `event_seq` 2, the transcript, and the outbox events `task.created` and `task.ready` —
so the runner and relay cannot tell the two paths apart. Idempotent on (tenant, idempotency_key):
a key seen before (in the DB or earlier in the batch) returns that task, or a conflict.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import JSON, Connection, Table, insert, select
from sqlalchemy.exc import IntegrityError

from orchestrator.clock import utcnow
from orchestrator.config import Budgets
from orchestrator.statemachine import TaskEvent, TaskStatus, next_task_status
from orchestrator.store import IdempotencyConflict, NewTask, events_t, messages_t, tasks_t
from orchestrator.tracing import new_traceparent, record_transition, valid_traceparent

_LOOKUP_CHUNK = 500
_COPY_MIN_ROWS = 8  # below this a plain INSERT is cheaper than the COPY protocol


def _transcript(spec: NewTask) -> list[dict[str, Any]]:
    # Mirrors store.create_task (no attachments here).
    out: list[dict[str, Any]] = []
    if spec.system_prompt:
        out.append({"role": "system", "content": spec.system_prompt})
    out.extend(dict(m) for m in spec.messages)
    out.append({"role": "user", "content": spec.goal})
    return out


def bulk_create_tasks(
    conn: Connection,
    specs: Sequence[NewTask],
    budgets: Budgets,
    *,
    inserted: dict[str, dict[str, Any]] | None = None,
) -> list[tuple[str, bool] | IdempotencyConflict]:
    """Per spec: `(task_id, created)` or an `IdempotencyConflict`. Never commits.

    Specs must have no attachments; a spec without an idempotency key is always created. A
    concurrent insert of the same key by another process surfaces as an IntegrityError: the caller
    retries. `inserted`, if given, receives the new task rows by id (the caller need not re-read
    them).
    """
    if any(s.attachment_ids for s in specs):
        raise ValueError("bulk_create_tasks takes tasks without attachments")
    hashes = [s.request_hash() for s in specs]
    by_tenant: dict[str, set[str]] = {}
    for s in specs:
        if s.idempotency_key is not None:
            by_tenant.setdefault(s.tenant, set()).add(s.idempotency_key)
    known: dict[tuple[str, str], tuple[str, str]] = {}
    for tenant, keys in by_tenant.items():
        # `tenant = :t AND key IN (…)` walks the unique index; a row-value IN list may not.
        key_list = sorted(keys)
        for i in range(0, len(key_list), _LOOKUP_CHUNK):
            rows = conn.execute(
                select(tasks_t.c.id, tasks_t.c.idempotency_key, tasks_t.c.request_hash).where(
                    tasks_t.c.tenant == tenant,
                    tasks_t.c.idempotency_key.in_(key_list[i : i + _LOOKUP_CHUNK]),
                )
            )
            for r in rows:
                known[(tenant, r.idempotency_key)] = (r.id, r.request_hash)

    status = next_task_status(TaskStatus.PENDING.value, TaskEvent.ADMIT)
    now = utcnow()
    task_rows: list[dict[str, Any]] = []
    message_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    results: list[tuple[str, bool] | IdempotencyConflict] = []
    for spec, req_hash in zip(specs, hashes, strict=True):
        key = (spec.tenant, spec.idempotency_key)
        if spec.idempotency_key is not None and key in known:
            task_id, prior = known[key]
            results.append((task_id, False) if prior == req_hash else IdempotencyConflict(task_id))
            continue
        task_id = str(uuid.uuid4())
        if spec.idempotency_key is not None:
            known[key] = (task_id, req_hash)
        results.append((task_id, True))
        max_steps = min(spec.max_steps or budgets.max_steps, budgets.max_steps)
        max_tokens = min(spec.max_tokens or budgets.max_tokens, budgets.max_tokens)
        deadline_s = min(spec.deadline_s or budgets.deadline_s, budgets.deadline_s)
        task_rows.append(
            {
                "id": task_id,
                "tenant": spec.tenant,
                "idempotency_key": spec.idempotency_key,
                "request_hash": req_hash,
                "status": status.value,
                "allowed_tools": None if spec.allowed_tools is None else list(spec.allowed_tools),
                "sampling": dict(spec.sampling) if spec.sampling else None,
                "metadata": dict(spec.metadata) if spec.metadata else None,
                "max_steps": max_steps,
                "max_tokens": max_tokens,
                "deadline_at": now + dt.timedelta(seconds=deadline_s),
                "next_run_at": now,
                "traceparent": valid_traceparent(spec.traceparent) or new_traceparent(),
                "event_seq": 2,
                "created_at": now,
                "updated_at": now,
            }
        )
        for seq, m in enumerate(_transcript(spec)):
            message_rows.append(
                {
                    "task_id": task_id,
                    "seq": seq,
                    "role": m["role"],
                    "content": m.get("content"),
                    "tool_calls": m.get("tool_calls"),
                    "tool_call_id": m.get("tool_call_id"),
                    "step_index": None,
                    "created_at": now,
                }
            )
        created = {"tenant": spec.tenant, "max_steps": max_steps, "max_tokens": max_tokens}
        admitted = {"from": TaskStatus.PENDING.value, "to": status.value}
        event_rows.append(
            {"task_id": task_id, "seq": 1, "type": "task.created", "payload": created, "created_at": now}
        )
        event_rows.append(
            {
                "task_id": task_id,
                "seq": 2,
                "type": "task." + status.value.lower(),
                "payload": admitted,
                "created_at": now,
            }
        )
    if inserted is not None:
        inserted.update((r["id"], r) for r in task_rows)
    if task_rows:
        if conn.dialect.name == "postgresql" and len(task_rows) >= _COPY_MIN_ROWS:
            _copy(conn, tasks_t, task_rows)
            _copy(conn, messages_t, message_rows)
            _copy(conn, events_t, event_rows)
        else:
            conn.execute(insert(tasks_t), task_rows)
            conn.execute(insert(messages_t), message_rows)
            conn.execute(insert(events_t), event_rows)
    for r in task_rows:  # the admission, as `store.transition_task` traces its transitions
        record_transition("task", r["id"], TaskStatus.PENDING.value, r["status"], r["traceparent"])
    return results


def _copy(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """COPY rows into `table` inside the current transaction (PostgreSQL).

    An executemany is one server round trip per row plus SQLAlchemy's per-row parameter
    processing; COPY streams the batch. JSON columns are serialised here (the driver has no
    dumper for dicts in COPY); datetimes are timezone-aware UTC, as `UTCDateTime` would bind them.
    A unique violation (a concurrent insert of the same key) is raised as `IntegrityError`.
    """
    import psycopg

    cols = list(rows[0])
    json_cols = {c for c in cols if isinstance(table.c[c].type, JSON)}
    dbapi = conn.connection.driver_connection
    try:
        with (
            dbapi.cursor() as cur,
            cur.copy(
                f"COPY {table.name} ({', '.join(f'{chr(34)}{c}{chr(34)}' for c in cols)}) FROM STDIN"
            ) as copy,
        ):
            for r in rows:
                copy.write_row(
                    [json.dumps(r[c]) if c in json_cols and r[c] is not None else r[c] for c in cols]
                )
    except psycopg.errors.IntegrityError as exc:
        raise IntegrityError(f"COPY {table.name}", None, exc) from exc

"""Task creation: the one path for REST (single and bulk), Kafka ingest and the CLI.

`create_tasks` writes any number of tasks in a few statements: the task rows (READY, or
PREPROCESSING when they have attachments: PENDING → ADMIT/PREPROCESS, checked against the state
machine), `event_seq` 2, the transcript, the outbox events `task.created` and the admission, and
the attachments' owner. Idempotent on (tenant, idempotency_key): a key seen before (in the
database or earlier in the batch) returns that task, or an `IdempotencyConflict`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import threading
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import JSON, Connection, Table, insert, select, update
from sqlalchemy.exc import IntegrityError

from orchestrator.clock import utcnow
from orchestrator.config import Budgets
from orchestrator.db.tables import attachments_t, events_t, messages_t, tasks_t
from orchestrator.statemachine import TaskEvent, TaskStatus, TaskTransition
from orchestrator.tasks.errors import IdempotencyConflict
from orchestrator.tracing import new_traceparent, record_transition, valid_traceparent

_LOOKUP_CHUNK = 500
_COPY_MIN_ROWS = 8  # below this a plain INSERT is cheaper than the COPY protocol

# (tenant, idempotency_key) -> (task id, request hash) of the tasks that exist already.
Known = dict[tuple[str, str], tuple[str, str]]


def new_task_id() -> str:
    """A UUIDv7 (RFC 9562: 48-bit Unix milliseconds, then 74 random bits) as 36-character text,
    increasing within this process (RFC 9562 6.2, method 2: an id drawn within the same
    millisecond as the last one, or behind it, is the last one plus one).

    Time-ordered ids put the rows of the tasks running now at the right-hand end of every index
    keyed by task (the step, message and event keys), where a full leaf splits off a nearly empty
    page; random (v4) ids spread them over the whole index, and each full leaf split in half,
    logging ~4 KB of WAL."""
    global _last_id
    drawn = (time.time_ns() // 1_000_000) << 74 | int.from_bytes(os.urandom(10)) >> 6
    with _id_lock:
        _last_id = value = max(drawn, _last_id + 1)
    # 48 bits of time, version 7, 12 bits, the variant (0b10), 62 bits
    full = (value >> 74) << 80 | 0x7 << 76 | ((value >> 62) & 0xFFF) << 64 | 0x2 << 62 | value & (2**62 - 1)
    return str(uuid.UUID(int=full))


_id_lock = threading.Lock()
_last_id = 0  # the 122 bits of the last id (time, then the random bits), as an integer


@dataclass(frozen=True, slots=True)
class NewTask:
    """A validated task submission (from REST, Kafka or the CLI)."""

    tenant: str
    goal: str
    messages: Sequence[Mapping[str, Any]] = ()
    system_prompt: str | None = None
    allowed_tools: Sequence[str] | None = None
    sampling: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] | None = None
    max_steps: int | None = None
    max_tokens: int | None = None
    deadline_s: float | None = None
    max_context_tokens: int | None = None
    context_policy: str | None = None  # `runner.payloads.CONTEXT_POLICIES`; None: "fail"
    idempotency_key: str | None = None
    attachment_ids: Sequence[str] = ()
    traceparent: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def request_hash(self) -> str:
        body = {
            "goal": self.goal,
            "messages": list(self.messages),
            "system_prompt": self.system_prompt,
            "allowed_tools": None if self.allowed_tools is None else list(self.allowed_tools),
            "sampling": self.sampling,
            "metadata": self.metadata,
            "max_steps": self.max_steps,
            "max_tokens": self.max_tokens,
            "deadline_s": self.deadline_s,
            "attachment_ids": list(self.attachment_ids),
        }
        if self.max_context_tokens is not None:  # (the hash of a task without one is unchanged)
            body["context"] = [self.max_context_tokens, self.context_policy]
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()

    def transcript(self) -> list[dict[str, Any]]:
        """The task's first messages: system prompt, prior messages, the goal (with its images)."""
        out: list[dict[str, Any]] = []
        if self.system_prompt:
            out.append({"role": "system", "content": self.system_prompt})
        out.extend(dict(m) for m in self.messages)
        content: Any = self.goal
        if self.attachment_ids:
            content = [{"type": "text", "text": self.goal}] + [
                {"type": "image_url", "image_url": {"url": f"dayzero://attachments/{a}"}}
                for a in self.attachment_ids
            ]
        out.append({"role": "user", "content": content})
        return out


def existing_tasks(conn: Connection, specs: Sequence[NewTask]) -> Known:
    """The tasks the specs' idempotency keys already made (one indexed query per tenant)."""
    by_tenant: dict[str, set[str]] = {}
    for s in specs:
        if s.idempotency_key is not None:
            by_tenant.setdefault(s.tenant, set()).add(s.idempotency_key)
    known: Known = {}
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
    return known


def replay_of(known: Known, spec: NewTask) -> tuple[str, bool] | IdempotencyConflict | None:
    """What a spec whose key is in `known` returns: the first task, or a conflict; None if new."""
    if spec.idempotency_key is None or (spec.tenant, spec.idempotency_key) not in known:
        return None
    task_id, prior = known[(spec.tenant, spec.idempotency_key)]
    return (task_id, False) if prior == spec.request_hash() else IdempotencyConflict(task_id)


def create_tasks(
    conn: Connection,
    specs: Sequence[NewTask],
    budgets: Budgets,
    *,
    known: Known | None = None,
    inserted: dict[str, dict[str, Any]] | None = None,
) -> list[tuple[str, bool] | IdempotencyConflict]:
    """Per spec: `(task_id, created)` or an `IdempotencyConflict`. Never commits.

    `known` is `existing_tasks(conn, specs)` when the caller looked it up already. A concurrent
    insert of the same key by another process surfaces as an IntegrityError: the caller retries.
    `inserted`, if given, receives the new task rows by id (the caller need not re-read them).
    """
    known = dict(existing_tasks(conn, specs) if known is None else known)
    now = utcnow()
    task_rows: list[dict[str, Any]] = []
    message_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    owned: list[tuple[str, str, list[str]]] = []  # (task id, tenant, attachment ids)
    results: list[tuple[str, bool] | IdempotencyConflict] = []
    for spec in specs:
        replay = replay_of(known, spec)
        if replay is not None:
            results.append(replay)
            continue
        task_id = new_task_id()
        req_hash = spec.request_hash()
        if spec.idempotency_key is not None:
            known[(spec.tenant, spec.idempotency_key)] = (task_id, req_hash)
        results.append((task_id, True))
        admission = TaskTransition(
            TaskStatus.PENDING.value, TaskEvent.PREPROCESS if spec.attachment_ids else TaskEvent.ADMIT, now
        )
        status = admission.new
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
                "max_context_tokens": spec.max_context_tokens,
                "context_policy": (spec.context_policy or "fail") if spec.max_context_tokens else None,
                "deadline_at": now + dt.timedelta(seconds=deadline_s),
                "next_run_at": now,
                # every task is one trace: keep the submitter's context, or start a new trace
                "traceparent": valid_traceparent(spec.traceparent) or new_traceparent(),
                "event_seq": 2,
                "created_at": now,
                "updated_at": now,
            }
        )
        for seq, m in enumerate(spec.transcript()):
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
        for seq, typ, payload in (
            (1, "task.created", created),
            (2, admission.event_type, admission.event_payload),
        ):
            event_rows.append(
                {"task_id": task_id, "seq": seq, "type": typ, "payload": payload, "created_at": now}
            )
        if spec.attachment_ids:
            owned.append((task_id, spec.tenant, list(spec.attachment_ids)))
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
    for task_id, tenant, att_ids in owned:
        conn.execute(
            update(attachments_t)
            .where(attachments_t.c.id.in_(att_ids), attachments_t.c.tenant == tenant)
            .values(task_id=task_id, updated_at=now)
        )
    for r in task_rows:  # the admission, traced like every other transition
        record_transition("task", r["id"], TaskStatus.PENDING.value, r["status"], r["traceparent"])
    return results


def create_task(conn: Connection, spec: NewTask, budgets: Budgets) -> tuple[str, bool]:
    """`create_tasks` for one task: `(task_id, created)`; raises `IdempotencyConflict`."""
    (out,) = create_tasks(conn, [spec], budgets)
    if isinstance(out, IdempotencyConflict):
        raise out
    return out


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

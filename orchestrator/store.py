"""Reads and writes of tasks, steps, attempts, messages and events (SQLAlchemy Core).

Functions take an open `Connection` inside a transaction and never commit: the caller's unit of
work does (`with engine.begin() as conn:`). Status changes go through `statemachine`.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from orchestrator.clock import utcnow
from orchestrator.config import Budgets
from orchestrator.db.models import Attachment, Event, Message, Step, StepAttempt, Task
from orchestrator.statemachine import (
    TERMINAL_TASK_STATUSES,
    IllegalTransition,
    TaskEvent,
    TaskStatus,
    next_task_status,
)
from orchestrator.tracing import new_traceparent, record_transition, valid_traceparent

tasks_t = Task.__table__
steps_t = Step.__table__
attempts_t = StepAttempt.__table__
messages_t = Message.__table__
events_t = Event.__table__
attachments_t = Attachment.__table__


class TaskNotFound(LookupError):
    """No such task for this tenant (ids of other tenants are indistinguishable from missing ones)."""


class IdempotencyConflict(Exception):
    """The idempotency key was used before with a different request body."""

    def __init__(self, task_id: str):
        super().__init__(f"idempotency key already used for task {task_id} with a different request")
        self.task_id = task_id


class StaleTransition(Exception):
    """The row was not in the expected state: another process changed it first."""


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
        return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


def append_events(conn: Connection, task_id: str, first_seq: int, events: Sequence[tuple[str, dict]]) -> None:
    """Insert outbox rows with consecutive per-task sequence numbers starting at `first_seq`."""
    if not events:
        return
    now = utcnow()
    conn.execute(
        insert(events_t),
        [
            {"task_id": task_id, "seq": first_seq + i, "type": typ, "payload": payload, "created_at": now}
            for i, (typ, payload) in enumerate(events)
        ],
    )


def bump_event_seq(conn: Connection, task_id: str, n: int) -> int:
    """Reserve `n` event sequence numbers for a task; returns the first."""
    last = conn.execute(
        update(tasks_t)
        .where(tasks_t.c.id == task_id)
        .values(event_seq=tasks_t.c.event_seq + n)
        .returning(tasks_t.c.event_seq)
    ).scalar_one()
    return last - n + 1


def transition_task(
    conn: Connection,
    task_id: str,
    expected: str,
    event: TaskEvent,
    *,
    values: Mapping[str, Any] | None = None,
    payload: Mapping[str, Any] | None = None,
    extra_events: Sequence[tuple[str, dict]] = (),
) -> TaskStatus:
    """Move a task from `expected` by `event`, appending its outbox event(s) in this transaction."""
    new = next_task_status(expected, event)
    now = utcnow()
    vals: dict[str, Any] = {"status": new.value, "updated_at": now, **(values or {})}
    if new in TERMINAL_TASK_STATUSES:
        vals.update(finished_at=now, lease_owner=None, lease_until=None)
    n = 1 + len(extra_events)
    row = conn.execute(
        update(tasks_t)
        .where(tasks_t.c.id == task_id, tasks_t.c.status == expected)
        .values(event_seq=tasks_t.c.event_seq + n, **vals)
        .returning(tasks_t.c.event_seq, tasks_t.c.traceparent)
    ).first()
    if row is None:
        raise StaleTransition(f"task {task_id} is no longer {expected}")
    last = row.event_seq
    events = [
        *extra_events,
        ("task." + new.value.lower(), {"from": expected, "to": new.value, **(payload or {})}),
    ]
    append_events(conn, task_id, last - n + 1, events)
    record_transition("task", task_id, expected, new.value, row.traceparent)
    return new


def create_task(conn: Connection, spec: NewTask, budgets: Budgets) -> tuple[str, bool]:
    """Insert a task with its initial transcript; idempotent on (tenant, idempotency_key).

    Returns `(task_id, created)`. Raises `IdempotencyConflict` when the key was used with another
    body. The task is left PENDING if it has attachments to preprocess, else READY.
    """
    req_hash = spec.request_hash()
    if spec.idempotency_key is not None:
        existing = conn.execute(
            select(tasks_t.c.id, tasks_t.c.request_hash).where(
                tasks_t.c.tenant == spec.tenant, tasks_t.c.idempotency_key == spec.idempotency_key
            )
        ).first()
        if existing is not None:
            if existing.request_hash != req_hash:
                raise IdempotencyConflict(existing.id)
            return existing.id, False
    task_id = str(uuid.uuid4())
    now = utcnow()
    max_steps = min(spec.max_steps or budgets.max_steps, budgets.max_steps)
    max_tokens = min(spec.max_tokens or budgets.max_tokens, budgets.max_tokens)
    deadline_s = min(spec.deadline_s or budgets.deadline_s, budgets.deadline_s)
    conn.execute(
        insert(tasks_t).values(
            id=task_id,
            tenant=spec.tenant,
            idempotency_key=spec.idempotency_key,
            request_hash=req_hash,
            status=TaskStatus.PENDING.value,
            allowed_tools=None if spec.allowed_tools is None else list(spec.allowed_tools),
            sampling=dict(spec.sampling) if spec.sampling else None,
            max_steps=max_steps,
            max_tokens=max_tokens,
            deadline_at=now + dt.timedelta(seconds=deadline_s),
            next_run_at=now,
            # every task is one trace: keep the submitter's context, or start a new trace
            traceparent=valid_traceparent(spec.traceparent) or new_traceparent(),
            created_at=now,
            updated_at=now,
            **{"metadata": dict(spec.metadata) if spec.metadata else None},
        )
    )
    transcript: list[dict[str, Any]] = []
    if spec.system_prompt:
        transcript.append({"role": "system", "content": spec.system_prompt})
    transcript.extend(dict(m) for m in spec.messages)
    user_content: Any = spec.goal
    if spec.attachment_ids:
        user_content = [{"type": "text", "text": spec.goal}] + [
            {"type": "image_url", "image_url": {"url": f"dayzero://attachments/{a}"}}
            for a in spec.attachment_ids
        ]
    transcript.append({"role": "user", "content": user_content})
    append_messages(conn, task_id, 0, transcript, step_index=None)
    if spec.attachment_ids:
        conn.execute(
            update(attachments_t)
            .where(attachments_t.c.id.in_(list(spec.attachment_ids)), attachments_t.c.tenant == spec.tenant)
            .values(task_id=task_id, updated_at=now)
        )
    event = TaskEvent.PREPROCESS if spec.attachment_ids else TaskEvent.ADMIT
    created = ("task.created", {"tenant": spec.tenant, "max_steps": max_steps, "max_tokens": max_tokens})
    transition_task(conn, task_id, TaskStatus.PENDING.value, event, extra_events=[created])
    return task_id, True


def append_messages(
    conn: Connection,
    task_id: str,
    first_seq: int,
    messages: Sequence[Mapping[str, Any]],
    *,
    step_index: int | None,
) -> None:
    if not messages:
        return
    now = utcnow()
    conn.execute(
        insert(messages_t),
        [
            {
                "task_id": task_id,
                "seq": first_seq + i,
                "role": m["role"],
                "content": m.get("content"),
                "tool_calls": m.get("tool_calls"),
                "tool_call_id": m.get("tool_call_id"),
                "step_index": step_index,
                "created_at": now,
            }
            for i, m in enumerate(messages)
        ],
    )


def request_cancel(conn: Connection, task_id: str, tenant: str | None = None) -> str:
    """Ask for cancellation. A task no runner holds is cancelled now; a running one at its next
    step boundary. Returns the status after the call."""
    q = select(tasks_t.c.status, tasks_t.c.lease_owner, tasks_t.c.lease_until).where(tasks_t.c.id == task_id)
    if tenant is not None:
        q = q.where(tasks_t.c.tenant == tenant)
    row = conn.execute(q.with_for_update()).first()
    if row is None:
        raise TaskNotFound(task_id)
    if TaskStatus(row.status) in TERMINAL_TASK_STATUSES:
        return row.status
    held = row.lease_owner is not None and row.lease_until is not None and row.lease_until > utcnow()
    if held:
        conn.execute(update(tasks_t).where(tasks_t.c.id == task_id).values(cancel_requested=True))
        return row.status
    try:
        return transition_task(
            conn, task_id, row.status, TaskEvent.CANCEL, values={"cancel_requested": True}
        ).value
    except IllegalTransition:
        return row.status


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
    return list(
        conn.execute(
            select(attempts_t)
            .where(attempts_t.c.task_id == task_id)
            .order_by(attempts_t.c.step_index, attempts_t.c.attempt)
        )
    )


def list_messages(conn: Connection, task_id: str) -> list[dict[str, Any]]:
    rows = conn.execute(select(messages_t).where(messages_t.c.task_id == task_id).order_by(messages_t.c.seq))
    return [message_dict(r) for r in rows]


def message_dict(r: Row[Any]) -> dict[str, Any]:
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


def delete_task(conn: Connection, task_id: str, tenant: str | None = None) -> None:
    """Delete a finished task and everything it owns (the per-step tables carry no FKs)."""
    task = get_task(conn, task_id, tenant)
    if TaskStatus(task.status) not in TERMINAL_TASK_STATUSES:
        raise IllegalTransition("task", task.status, "delete")
    for table in (attempts_t, steps_t, messages_t, events_t):
        conn.execute(table.delete().where(table.c.task_id == task_id))
    conn.execute(tasks_t.delete().where(tasks_t.c.id == task_id))

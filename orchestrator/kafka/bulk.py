"""Many tasks in one transaction: what `store.create_task` does per task, in a few statements.

Used by Kafka ingest for plain tasks (no attachments), which dominate its throughput. The rows are
exactly those `create_task` writes — task READY (PENDING → ADMIT, checked against the state
machine), `event_seq` 2, the transcript, and the outbox events `task.created` and `task.ready` —
so the runner and relay cannot tell the two paths apart. Idempotent on (tenant, idempotency_key):
a key seen before (in the DB or earlier in the batch) returns that task, or a conflict.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection, insert, select, tuple_

from orchestrator.clock import utcnow
from orchestrator.config import Budgets
from orchestrator.statemachine import TaskEvent, TaskStatus, next_task_status
from orchestrator.store import IdempotencyConflict, NewTask, events_t, messages_t, tasks_t

_LOOKUP_CHUNK = 500


def _transcript(spec: NewTask) -> list[dict[str, Any]]:
    # Mirrors store.create_task (no attachments here).
    out: list[dict[str, Any]] = []
    if spec.system_prompt:
        out.append({"role": "system", "content": spec.system_prompt})
    out.extend(dict(m) for m in spec.messages)
    out.append({"role": "user", "content": spec.goal})
    return out


def bulk_create_tasks(
    conn: Connection, specs: Sequence[NewTask], budgets: Budgets
) -> list[tuple[str, bool] | IdempotencyConflict]:
    """Per spec: `(task_id, created)` or an `IdempotencyConflict`. Never commits.

    Every spec must carry an idempotency key and no attachments. A concurrent insert of the same
    key by another process surfaces as an IntegrityError: the caller retries one by one.
    """
    if any(s.idempotency_key is None or s.attachment_ids for s in specs):
        raise ValueError("bulk_create_tasks takes keyed tasks without attachments")
    hashes = [s.request_hash() for s in specs]
    pairs = list({(s.tenant, s.idempotency_key) for s in specs})
    known: dict[tuple[str, str], tuple[str, str]] = {}
    for i in range(0, len(pairs), _LOOKUP_CHUNK):
        chunk = pairs[i : i + _LOOKUP_CHUNK]
        rows = conn.execute(
            select(tasks_t.c.id, tasks_t.c.tenant, tasks_t.c.idempotency_key, tasks_t.c.request_hash).where(
                tuple_(tasks_t.c.tenant, tasks_t.c.idempotency_key).in_(chunk)
            )
        )
        for r in rows:
            known[(r.tenant, r.idempotency_key)] = (r.id, r.request_hash)

    status = next_task_status(TaskStatus.PENDING.value, TaskEvent.ADMIT)
    now = utcnow()
    task_rows: list[dict[str, Any]] = []
    message_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    results: list[tuple[str, bool] | IdempotencyConflict] = []
    for spec, req_hash in zip(specs, hashes, strict=True):
        key = (spec.tenant, spec.idempotency_key)
        if key in known:
            task_id, prior = known[key]
            results.append((task_id, False) if prior == req_hash else IdempotencyConflict(task_id))
            continue
        task_id = str(uuid.uuid4())
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
                "traceparent": spec.traceparent,
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
    if task_rows:
        conn.execute(insert(tasks_t), task_rows)
        conn.execute(insert(messages_t), message_rows)
        conn.execute(insert(events_t), event_rows)
    return results

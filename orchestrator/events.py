"""An outbox event as the relay publishes it and the SSE feed streams it."""

from __future__ import annotations

import datetime as dt
from typing import Any

TERMINAL_EVENT_TYPES = frozenset({"task.succeeded", "task.failed", "task.cancelled", "task.timed_out"})


def event_record(
    task_id: str, seq: int, type_: str, payload: Any, created_at: dt.datetime, tenant: str | None
) -> dict[str, Any]:
    return {
        "task_id": task_id,
        "tenant": tenant,
        "seq": seq,
        "type": type_,
        "payload": payload,
        "created_at": created_at.isoformat(),
    }

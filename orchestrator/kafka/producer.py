"""Producer side: put a task on `dayzero.tasks` (used by `dayzero submit --kafka` and the example)."""

from __future__ import annotations

import uuid
from typing import Any

from orchestrator.tasks.schemas import KafkaTaskMessage


def task_message(
    tenant: str, body: dict[str, Any], idempotency_key: str | None = None
) -> tuple[bytes, bytes]:
    """(key, value) of a `dayzero.tasks` record; the body is validated here, before it travels."""
    msg = KafkaTaskMessage.model_validate({**body, "tenant": tenant})
    key = idempotency_key or str(uuid.uuid4())
    return key.encode(), msg.model_dump_json(exclude_defaults=True).encode()


def send_task(
    producer: Any,
    tenant: str,
    body: dict[str, Any],
    *,
    idempotency_key: str | None = None,
    topic: str = "dayzero.tasks",
    traceparent: str | None = None,
) -> Any:
    """Send one task; returns the send future (call `.get()` to wait for the broker's ack)."""
    key, value = task_message(tenant, body, idempotency_key)
    headers = [("traceparent", traceparent.encode())] if traceparent else []
    return producer.send(topic, key=key, value=value, headers=headers)

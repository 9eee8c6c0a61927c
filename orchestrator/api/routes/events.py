"""`GET /v1/tasks/{id}/events`: Server-Sent Events, resumable with `Last-Event-ID` (= event seq)."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Annotated, Any

import anyio
from fastapi import APIRouter, Query, Request
from fastapi.responses import StreamingResponse
from sqlalchemy import Engine, select

from orchestrator.api.deps import DbDep, IngressDep, TenantDep
from orchestrator.api.errors import ProblemError, problem_responses
from orchestrator.api.feed import EventFeed
from orchestrator.api.routes.tasks import TaskId
from orchestrator.db.tables import events_t
from orchestrator.events import event_record
from orchestrator.metrics import SSE_STREAMS
from orchestrator.statemachine import TERMINAL_TASK_STATUSES, TaskStatus
from orchestrator.tasks.queries import get_task

router = APIRouter(prefix="/v1/tasks", tags=["events"])
MAX_EVENT_ID = 999_999_999_999_999_999  # 18 digits: below 2^63, so a valid BIGINT `events.seq` bound

SSE_DESCRIPTION = """A `text/event-stream` of the task's events in order, from its creation (or
after `Last-Event-ID`) until its final state. Each event: `id` = the event's per-task sequence
number, `event` = its type (`task.created`, `task.running`, `step.started`, …), `data` = JSON
`{task_id, tenant, seq, type, payload, created_at}`. The stream ends after the terminal event."""


def _read(engine: Engine, task_id: str, after: int) -> tuple[bool, list[Any]]:
    with engine.connect() as conn:
        terminal = TaskStatus(get_task(conn, task_id).status) in TERMINAL_TASK_STATUSES
        e = events_t.c
        rows = conn.execute(  # not the history columns: a long task's messages are megabytes
            select(e.id, e.task_id, e.seq, e.type, e.payload, e.created_at)
            .where(events_t.c.task_id == task_id, events_t.c.seq > after)
            .order_by(events_t.c.seq)
            .limit(500)
        )
        return terminal, list(rows)


# Ends a stream whose API key was revoked while it was open (checked every key-cache TTL).
_REVOKED = b'event: error\ndata: {"error": "the API key of this stream was revoked"}\n\n'


def _frame(e: Any, tenant: str) -> bytes:
    data = json.dumps(event_record(e.task_id, e.seq, e.type, e.payload, e.created_at, tenant), default=str)
    return f"id: {e.seq}\nevent: {e.type}\ndata: {data}\n\n".encode()


def _last_event_id(request: Request) -> int:
    # Read by hand and documented in `openapi_extra`: as a declared optional header FastAPI would
    # document it nullable, and "null" is no event id.
    raw = request.headers.get("last-event-id")
    if raw is None or raw == "":
        return 0
    if not raw.isdigit() or len(raw) > 18:
        raise ProblemError(
            422,
            "Unprocessable Content",
            "Last-Event-ID must be an event seq (an integer >= 0)",
            type_="validation-error",
        )
    return int(raw)


_LAST_EVENT_ID_PARAM = {
    "name": "Last-Event-ID",
    "in": "header",
    "required": False,
    "description": "resume after this event seq (sent by EventSource clients on reconnect)",
    "schema": {"type": "integer", "minimum": 0, "maximum": MAX_EVENT_ID},
}


@router.get(
    "/{task_id}/events",
    openapi_extra={"parameters": [_LAST_EVENT_ID_PARAM]},
    summary="Follow a task live (Server-Sent Events)",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": SSE_DESCRIPTION,
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        **problem_responses(401, 404, 422),
    },
)
async def stream_events(
    task_id: TaskId,
    request: Request,
    tenant: TenantDep,
    engine: DbDep,
    ingress: IngressDep,
    after: Annotated[
        int | None,
        Query(ge=0, le=MAX_EVENT_ID, description="resume after this seq (for clients without headers)"),
    ] = None,
) -> StreamingResponse:
    def check() -> None:
        with engine.connect() as conn:
            get_task(conn, task_id, tenant)  # 404 for a missing task or another tenant's

    await anyio.to_thread.run_sync(check)
    feed: EventFeed = request.app.state.feed
    start = max(_last_event_id(request), after or 0)

    key_cache = request.app.state.key_cache
    key = request.state.api_key

    async def body() -> AsyncIterator[bytes]:
        last = start
        key_checked = time.monotonic()
        SSE_STREAMS.inc()
        try:
            yield b"retry: 1000\n\n"
            with feed.subscribe(task_id) as sub:
                quiet_since = time.monotonic()
                while True:
                    sub.clear()  # before reading: a wake-up during the read is not lost
                    terminal, events = await anyio.to_thread.run_sync(_read, engine, task_id, last)
                    for e in events:
                        yield _frame(e, tenant)
                        last = e.seq
                    if events:
                        quiet_since = time.monotonic()
                        continue
                    if terminal:
                        return
                    if time.monotonic() - quiet_since > ingress.sse_keepalive_s:
                        yield b": keep-alive\n\n"
                        quiet_since = time.monotonic()
                    if time.monotonic() >= key_checked + key_cache.ttl_s:
                        key_checked = time.monotonic()
                        if await anyio.to_thread.run_sync(key_cache.tenant_for, key) != tenant:
                            yield _REVOKED  # the key this stream was opened with is gone
                            return
                    await sub.wait(min(ingress.sse_keepalive_s, key_cache.ttl_s))
        finally:
            SSE_STREAMS.dec()

    return StreamingResponse(
        body(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )

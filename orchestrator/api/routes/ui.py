"""`/ui`: the task timeline page (vanilla HTML/JS/CSS shipped in the package, no CDN).

The page itself is a static shell holding no data; everything it shows comes from API calls that
carry the caller's API key (`Authorization: Bearer`), so a tenant sees only its own tasks, as on
the REST API. The live view reads the same SSE stream as any client (`/v1/tasks/{id}/events`).
`GET /ui/api/tasks/{id}` adds what the page needs beyond `GET /v1/tasks/{id}`: when each step
started and the task's trace id with a link to the configured trace viewer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import FileResponse, RedirectResponse

from orchestrator.api.deps import DbDep, IngressDep, TenantDep
from orchestrator.api.errors import ProblemError
from orchestrator.api.routes.tasks import TaskId
from orchestrator.api.views import task_summary
from orchestrator.tasks.queries import get_task, list_attempts, list_steps, task_goals
from orchestrator.tracing import trace_id_of

router = APIRouter(prefix="/ui", include_in_schema=False)

ASSETS = Path(__file__).resolve().parent.parent / "ui"
_MEDIA = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css"}
# The page loads nothing but its own files and talks only to this origin.
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


def _asset(name: str) -> FileResponse:
    path = ASSETS / name
    if path.suffix not in _MEDIA or path.parent != ASSETS or not path.is_file():
        raise ProblemError(404, "Not Found", f"no such file: {name}")
    return FileResponse(path, media_type=_MEDIA[path.suffix], headers=_HEADERS)


@router.get("")
def ui_root() -> RedirectResponse:
    return RedirectResponse("/ui/")


@router.get("/")
def index() -> FileResponse:
    return _asset("index.html")


@router.get("/static/{name}")
def static(name: str) -> FileResponse:
    return _asset(name)


@router.get("/api/tasks/{task_id}")
def timeline(task_id: TaskId, tenant: TenantDep, engine: DbDep, ingress: IngressDep) -> dict[str, Any]:
    """The task, its steps with every attempt (times, status, error, usage) and its trace."""
    with engine.connect() as conn:
        task = get_task(conn, task_id, tenant)
        goal = task_goals(conn, [task_id]).get(task_id)
        steps = list_steps(conn, task_id)
        attempts = list_attempts(conn, task_id)
    by_step: dict[int, list[dict[str, Any]]] = {}
    for a in attempts:
        by_step.setdefault(a.step_index, []).append(
            {
                "attempt": a.attempt,
                "status": a.status,
                "resumed": bool(a.resumed),
                "error": a.error,
                "usage": a.usage,
                "started_at": a.started_at,
                "finished_at": a.finished_at,
            }
        )
    trace_id = trace_id_of(task.traceparent)
    template = ingress.trace_url_template
    return {
        "task": task_summary(task, goal).model_dump(mode="json"),
        "trace_id": trace_id,
        "trace_url": template.replace("{trace_id}", trace_id) if template and trace_id else None,
        "steps": [
            {
                "index": s.step_index,
                "kind": s.kind,
                "status": s.status,
                "tool_name": s.tool_name,
                "attempt_count": s.attempt_count,
                "created_at": s.created_at,
                "started_at": s.started_at,
                "finished_at": s.finished_at,
                "next_attempt_at": s.next_attempt_at,
                "error": s.error,
                "attempts": by_step.get(s.step_index, []),
            }
            for s in steps
        ],
    }

"""`/healthz` (the process is up), `/readyz` (DB reachable, schema current), `/metrics`."""

from __future__ import annotations

from fastapi import APIRouter, Response
from sqlalchemy import text

from orchestrator.api.deps import DbDep
from orchestrator.api.errors import ProblemError, problem_responses
from orchestrator.api.schemas import Health, Readiness
from orchestrator.db import migrate
from orchestrator.metrics import render

router = APIRouter(tags=["operations"])


@router.get("/healthz", response_model=Health)
async def healthz() -> Health:
    return Health(status="ok")


@router.get("/readyz", response_model=Readiness, responses=problem_responses(503))
def readyz(engine: DbDep) -> Readiness:
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        current, head = migrate.current_revision(engine), migrate.head_revision()
    except Exception as exc:  # any DB failure means not ready
        raise ProblemError(
            503, "Service Unavailable", f"database unreachable: {type(exc).__name__}"
        ) from None
    if current != head:
        raise ProblemError(
            503,
            "Service Unavailable",
            f"schema at {current!r}, code expects {head!r}",
            type_="schema-not-current",
        )
    return Readiness(status="ready", revision=current)


@router.get(
    "/metrics",
    response_class=Response,
    responses={
        200: {
            "description": "Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    },
)
def metrics() -> Response:
    body, content_type = render()
    return Response(body, media_type=content_type)

"""RFC 9457 problem+json for every error the API returns."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from core.outage import is_outage
from orchestrator.api.schemas import Problem
from orchestrator.db.engine import DB_ERRORS
from orchestrator.tasks.errors import IdempotencyConflict, TaskFinished, TaskNotFound

log = logging.getLogger(__name__)
PROBLEM_MEDIA_TYPE = "application/problem+json"
TYPE_BASE = "https://dayzero.dev/problems/"


class ProblemError(Exception):
    def __init__(
        self, status: int, title: str, detail: str | None = None, *, type_: str | None = None, **extra: Any
    ):
        super().__init__(detail or title)
        self.status, self.title, self.detail, self.type, self.extra = status, title, detail, type_, extra


def problem_response(
    request: Request,
    status: int,
    title: str,
    detail: str | None = None,
    type_: str | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": TYPE_BASE + type_ if type_ else "about:blank",
        "title": title,
        "status": status,
        "instance": request.url.path,
    }
    if detail is not None:
        body["detail"] = detail
    body.update({k: v for k, v in extra.items() if v is not None})
    headers = dict(headers or {})
    if status == 401:
        headers.setdefault("WWW-Authenticate", "Bearer")
    return JSONResponse(
        jsonable_encoder(body), status_code=status, media_type=PROBLEM_MEDIA_TYPE, headers=headers
    )


_TITLES = {
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    409: "Conflict",
    408: "Request Timeout",
    413: "Content Too Large",
    415: "Unsupported Media Type",
    422: "Unprocessable Content",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


def _allowed_methods(request: Request) -> str:
    """Every method any route serves at this path (Starlette lists only the first matching route's)."""
    from starlette.routing import Match

    methods: set[str] = set()
    for route in request.app.routes:
        match, _ = route.matches({**request.scope, "method": "GET"})
        if match != Match.NONE:
            methods |= set(getattr(route, "methods", None) or ())
    return ", ".join(sorted(methods))


def install(app: FastAPI) -> None:
    @app.exception_handler(ProblemError)
    async def _problem(request: Request, exc: ProblemError) -> JSONResponse:
        return problem_response(request, exc.status, exc.title, exc.detail, exc.type, **exc.extra)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        title = _TITLES.get(exc.status_code, "Error")
        detail = exc.detail if isinstance(exc.detail, str) and exc.detail != title else None
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        return problem_response(request, exc.status_code, title, detail, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [
            {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type", ""))}
            for e in exc.errors()
        ]
        return problem_response(
            request,
            422,
            "Unprocessable Content",
            "the request does not match the schema",
            "validation-error",
            errors=errors,
        )

    @app.exception_handler(TaskNotFound)
    async def _not_found(request: Request, exc: TaskNotFound) -> JSONResponse:
        return problem_response(request, 404, "Not Found", "no such task", "task-not-found")

    @app.exception_handler(TaskFinished)
    async def _finished(request: Request, exc: TaskFinished) -> JSONResponse:
        return problem_response(
            request,
            409,
            "Conflict",
            f"the task already ended {exc.status}: too late to cancel",
            "task-finished",
        )

    @app.exception_handler(IdempotencyConflict)
    async def _conflict(request: Request, exc: IdempotencyConflict) -> JSONResponse:
        return problem_response(
            request,
            409,
            "Conflict",
            "this Idempotency-Key was used with a different request body",
            "idempotency-conflict",
        )

    async def _db_error(request: Request, exc: Exception) -> JSONResponse:
        if not is_outage(exc):  # the database refused this request's data: a bug to look at
            return await _unhandled(request, exc)
        # The database is down, restarting or out of connections: the request may succeed in a
        # moment, so say when to retry (the client libraries and load balancers honour it).
        log.warning("database unavailable on %s %s: %s", request.method, request.url.path, type(exc).__name__)
        retry_after = request.app.state.ingress.db_retry_after_s
        return problem_response(
            request,
            503,
            "Service Unavailable",
            "the database is unavailable; retry shortly",
            "database-unavailable",
            headers={"Retry-After": str(retry_after)},
        )

    for exc_type in DB_ERRORS:
        app.add_exception_handler(exc_type, _db_error)

    @app.exception_handler(Exception)
    async def _unhandled(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return problem_response(request, 500, "Internal Server Error")


def title(status: int) -> str:
    return _TITLES.get(status, "Error")


def problem_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI `responses` entries for the error codes a route can return."""
    return {
        c: {
            "model": Problem,
            "description": _TITLES.get(c, "Error"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        for c in codes
    }

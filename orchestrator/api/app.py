"""The FastAPI app factory (`dayzero serve` and tests)."""

from __future__ import annotations

import gc
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import Engine

from core.frontdoor import FrontDoor, FrontDoorLimits, Refusal
from orchestrator.api import errors
from orchestrator.api.access_log import AccessLog
from orchestrator.api.feed import make_feed
from orchestrator.api.routes import attachments, events, health, tasks, ui
from orchestrator.auth import KeyCache
from orchestrator.config import IngressSettings, Settings
from orchestrator.db.engine import make_engine
from orchestrator.metrics import HTTP_LATENCY, HTTP_REQUESTS, HTTP_SHED, register_task_states
from orchestrator.tracing import setup_tracing

_STREAMED_PATHS = ("/v1/attachments",)  # these enforce their own (larger) limit while streaming
_EXEMPT_PATHS = ("/healthz", "/readyz", "/metrics")  # probes answer while the API is busy
_UNCOUNTED = ("/events",)  # event streams are long-lived and mostly idle: never shed, not counted


def front_door_limits(ingress: IngressSettings) -> FrontDoorLimits:
    """The REST API's front door (`core.frontdoor`): body, depth and shedding limits."""
    return FrontDoorLimits(
        max_body_bytes=ingress.max_body_bytes,
        max_json_depth=ingress.max_json_depth,
        body_timeout_s=ingress.body_timeout_s,
        max_in_flight=ingress.max_in_flight,
        max_queue=ingress.max_queue,
        max_queue_wait_s=ingress.max_queue_wait_s,
        retry_after_s=1,
        exempt_prefixes=_EXEMPT_PATHS,
        uncounted=_UNCOUNTED,
        streamed_prefixes=_STREAMED_PATHS,
    )


def _problem(status: int, code: str, message: str, path: str) -> tuple[str, bytes]:
    """A front-door refusal as problem+json (RFC 9457), like every other API error."""
    body = {"type": errors.TYPE_BASE + code, "title": errors.title(status), "status": status}
    body.update(detail=message, instance=path)
    return errors.PROBLEM_MEDIA_TYPE, json.dumps(body).encode()


def _observe(scope: dict, status: int, seconds: float) -> None:
    route = scope.get("route")
    path = getattr(route, "path", None) or "unmatched"
    HTTP_LATENCY.labels(scope["method"], path).observe(seconds)
    HTTP_REQUESTS.labels(scope["method"], path, str(status)).inc()


def _count_shed(r: Refusal) -> None:
    if r.status in (429, 503):
        HTTP_SHED.inc()


def _openapi_response(resp: dict[str, Any]) -> dict[str, Any]:
    return {"description": resp["description"], "content": resp["content"]}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """Error responses are documented as problem+json only (FastAPI would add application/json)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    # What the middleware and the DB-outage handler may answer on any API route, documented once.
    shared = errors.problem_responses(429, 503)
    with_body = errors.problem_responses(400, 413)
    for name, path in doc.get("paths", {}).items():
        for op in path.values():
            if name.startswith("/v1/"):
                for code, resp in {**shared, **(with_body if "requestBody" in op else {})}.items():
                    op.setdefault("responses", {}).setdefault(str(code), _openapi_response(resp))
        for op in path.values():
            for code, resp in op.get("responses", {}).items():
                content = resp.get("content", {})
                if code[0] in "45" and errors.PROBLEM_MEDIA_TYPE in content:
                    content.pop("application/json", None)
    _document_known_tools(doc, app.state.settings.known_tools())
    app.openapi_schema = doc
    return doc


def _document_known_tools(doc: dict[str, Any], known: frozenset[str]) -> None:
    """`allowed_tools` items are this deployment's tools (`Settings.known_tools()`): the published
    schema says so, so a schema-valid body is one the API accepts."""
    prop = doc.get("components", {}).get("schemas", {}).get("TaskCreate", {}).get("properties", {})
    allowed = prop.get("allowed_tools")
    for alt in allowed.get("anyOf", [allowed]) if allowed else []:
        if alt.get("type") == "array":
            alt["items"] = {**alt.get("items", {}), "enum": sorted(known)}


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    ingress: IngressSettings | None = None,
) -> FastAPI:
    settings = settings or Settings()
    ingress = ingress or settings.ingress
    own_engine = engine is None
    engine = engine or make_engine(settings.database_url, **({} if settings.is_sqlite else {"pool_size": 10}))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        setup_tracing("dayzero-api", settings.otlp_endpoint)
        if ingress.gc_freeze:
            gc.collect()
            gc.freeze()
        app.state.feed.start()
        try:
            yield
        finally:
            app.state.feed.stop()
            if own_engine:
                engine.dispose()

    app = FastAPI(
        title="dayzero",
        version="1.0.0",
        description="Submit long-horizon agent tasks and follow them live. Errors are RFC 9457 problem+json.",
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.ingress = ingress
    app.state.engine = engine
    app.state.key_cache = KeyCache(engine)
    app.state.feed = make_feed(engine, ingress.sse_poll_s, ingress.sse_listen, ingress.sse_tail_s)
    register_task_states(engine)
    errors.install(app)
    for r in (tasks.router, events.router, attachments.router, health.router, ui.router):
        app.include_router(r)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(
        FrontDoor,
        limits=front_door_limits(ingress),
        render=_problem,
        observe=_observe,
        on_refusal=_count_shed,
    )
    app.add_middleware(AccessLog)  # outermost: it also sees what the limits answer
    return app

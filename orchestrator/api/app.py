"""The FastAPI app factory (`dayzero serve` and tests)."""

from __future__ import annotations

import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import Engine

from orchestrator.api import errors
from orchestrator.api.config import IngressSettings
from orchestrator.api.routes import attachments, events, health, tasks, ui
from orchestrator.auth import KeyCache
from orchestrator.config import Settings
from orchestrator.db.engine import make_engine
from orchestrator.metrics import HTTP_LATENCY, HTTP_REQUESTS, register_task_states
from orchestrator.relay import make_feed
from orchestrator.tracing import setup_tracing

_STREAMED_PATHS = ("/v1/attachments",)  # these enforce their own (larger) limit while streaming


class LimitsAndMetrics:
    """Pure ASGI middleware: a body size limit (413 problem) and per-route request metrics."""

    def __init__(self, app: Any, max_body_bytes: int):
        self.app = app
        self.max = max_body_bytes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        limited = scope["method"] in ("POST", "PUT", "PATCH") and not scope["path"].startswith(
            _STREAMED_PATHS
        )
        if limited:
            for name, value in scope.get("headers", ()):
                if name == b"content-length" and value.isdigit() and int(value) > self.max:
                    await self._too_large(scope, send)
                    self._observe(scope, 413, t0)
                    return
        seen = 0
        over = False

        async def limited_receive() -> dict:
            # Past the limit the app is told the body ended; its response is replaced by a 413.
            nonlocal seen, over
            if over:
                return {"type": "http.request", "body": b"", "more_body": False}
            msg = await receive()
            if msg["type"] == "http.request":
                seen += len(msg.get("body", b""))
                if seen > self.max:
                    over = True
                    return {"type": "http.request", "body": b"", "more_body": False}
            return msg

        async def tracking_send(msg: dict) -> None:
            if over:
                if msg["type"] == "http.response.start":
                    await self._too_large(scope, send)
                    self._observe(scope, 413, t0)
                return
            if msg["type"] == "http.response.start":
                self._observe(scope, msg["status"], t0)
            await send(msg)

        await self.app(scope, limited_receive if limited else receive, tracking_send)

    def _observe(self, scope: dict, status: int, t0: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or "unmatched"
        HTTP_LATENCY.labels(scope["method"], path).observe(time.perf_counter() - t0)
        HTTP_REQUESTS.labels(scope["method"], path, str(status)).inc()

    async def _too_large(self, scope: dict, send: Any) -> None:
        import json

        body = json.dumps(
            {
                "type": errors.TYPE_BASE + "body-too-large",
                "title": "Content Too Large",
                "status": 413,
                "detail": f"request bodies are limited to {self.max} bytes",
                "instance": scope["path"],
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", errors.PROBLEM_MEDIA_TYPE.encode()),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


def _openapi(app: FastAPI) -> dict[str, Any]:
    """Error responses are documented as problem+json only (FastAPI would add application/json)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    for path in doc.get("paths", {}).values():
        for op in path.values():
            for code, resp in op.get("responses", {}).items():
                content = resp.get("content", {})
                if code[0] in "45" and errors.PROBLEM_MEDIA_TYPE in content:
                    content.pop("application/json", None)
    app.openapi_schema = doc
    return doc


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    ingress: IngressSettings | None = None,
) -> FastAPI:
    settings = settings or Settings()
    ingress = ingress or IngressSettings()
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
    app.state.feed = make_feed(engine, ingress.sse_poll_s, ingress.sse_listen)
    register_task_states(engine)
    errors.install(app)
    for r in (tasks.router, events.router, attachments.router, health.router, ui.router):
        app.include_router(r)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    app.add_middleware(LimitsAndMetrics, max_body_bytes=ingress.max_body_bytes)
    return app

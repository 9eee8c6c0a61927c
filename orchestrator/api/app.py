"""The FastAPI app factory (`dayzero serve` and tests)."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from sqlalchemy import Engine

from orchestrator.api import errors
from orchestrator.api.access_log import AccessLog
from orchestrator.api.feed import make_feed
from orchestrator.api.routes import attachments, events, health, tasks, ui
from orchestrator.auth import KeyCache
from orchestrator.config import IngressSettings, Settings
from orchestrator.db.engine import make_engine
from orchestrator.metrics import HTTP_LATENCY, HTTP_REQUESTS, HTTP_SHED, register_task_states
from orchestrator.tracing import setup_tracing
from preprocess import jsonlimits

_STREAMED_PATHS = ("/v1/attachments",)  # these enforce their own (larger) limit while streaming
_UNCOUNTED_PATHS = ("/healthz", "/readyz", "/metrics")


class LimitsAndMetrics:
    """Pure ASGI middleware, in front of everything: load shedding (503 + Retry-After past
    `max_in_flight` requests), a body size limit (413), a body time limit (408) and a JSON
    nesting limit (400) checked on the raw bytes before anything parses them, and per-route
    request metrics.

    Shedding at the door keeps latency bounded under overload: past the limit a request is
    answered at once instead of queueing for the thread pool (at 2x capacity the queue grew
    without bound: p50 18.6 s). Event streams and probes are not counted: a stream is long-lived
    and mostly idle, and a probe must answer while the API is busy."""

    def __init__(
        self,
        app: Any,
        max_body_bytes: int,
        max_json_depth: int = 32,
        max_in_flight: int = 0,
        body_timeout_s: float = 30.0,
    ):
        self.app = app
        self.body_timeout_s = body_timeout_s
        self.max = max_body_bytes
        self.max_depth = max_json_depth
        self.max_in_flight = max_in_flight  # 0: unlimited
        self.in_flight = 0

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path = scope["path"]
        counted = self.max_in_flight > 0 and not (
            path.startswith(_UNCOUNTED_PATHS) or path.endswith("/events")
        )
        if counted and self.in_flight >= self.max_in_flight:
            HTTP_SHED.inc()
            await _send_problem(
                scope, send, 503, "overloaded", "Service Unavailable",
                f"more than {self.max_in_flight} requests in flight; retry shortly",
                retry_after=1,
            )  # fmt: skip
            self._observe(scope, 503, t0)
            return
        if counted:
            self.in_flight += 1
        try:
            await self._limited(scope, receive, send, t0)
        finally:
            if counted:
                self.in_flight -= 1

    async def _limited(self, scope: dict, receive: Any, send: Any, t0: float) -> None:
        limited = scope["method"] in ("POST", "PUT", "PATCH") and not scope["path"].startswith(
            _STREAMED_PATHS
        )
        if not limited:
            await self.app(scope, receive, self._tracking(scope, send, t0))
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > self.max:
                await self._too_large(scope, send)
                self._observe(scope, 413, t0)
                return
        # The body is read here, whole (it is bounded), so its nesting is checked before any parser
        # recurses into it; the app then receives it in one piece.
        chunks, seen = [], 0
        while True:
            try:  # a body shorter than its Content-Length must not hold the connection for ever
                msg = await asyncio.wait_for(receive(), self.body_timeout_s)
            except TimeoutError:
                await _send_problem(
                    scope, send, 408, "body-timeout", "Request Timeout",
                    f"no request body arrived for {self.body_timeout_s:g} s",
                )  # fmt: skip
                self._observe(scope, 408, t0)
                return
            if msg["type"] != "http.request":
                return  # the client went away
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > self.max:
                await self._too_large(scope, send)
                self._observe(scope, 413, t0)
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            jsonlimits.check_depth(body, self.max_depth)
        except jsonlimits.JSONTooDeep as exc:
            await _send_problem(scope, send, 400, "body-too-deep", "Bad Request", str(exc))
            self._observe(scope, 400, t0)
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, self._tracking(scope, send, t0))

    def _tracking(self, scope: dict, send: Any, t0: float) -> Any:
        async def tracking_send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                self._observe(scope, msg["status"], t0)
            await send(msg)

        return tracking_send

    def _observe(self, scope: dict, status: int, t0: float) -> None:
        route = scope.get("route")
        path = getattr(route, "path", None) or "unmatched"
        HTTP_LATENCY.labels(scope["method"], path).observe(time.perf_counter() - t0)
        HTTP_REQUESTS.labels(scope["method"], path, str(status)).inc()

    async def _too_large(self, scope: dict, send: Any) -> None:
        await _send_problem(
            scope,
            send,
            413,
            "body-too-large",
            "Content Too Large",
            f"request bodies are limited to {self.max} bytes",
        )


async def _send_problem(
    scope: dict, send: Any, status: int, type_: str, title: str, detail: str, retry_after: int | None = None
) -> None:
    import json

    body = json.dumps(
        {
            "type": errors.TYPE_BASE + type_,
            "title": title,
            "status": status,
            "detail": detail,
            "instance": scope["path"],
        }
    ).encode()
    headers = [
        (b"content-type", errors.PROBLEM_MEDIA_TYPE.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if retry_after is not None:
        headers.append((b"retry-after", str(retry_after).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _openapi_response(resp: dict[str, Any]) -> dict[str, Any]:
    return {"description": resp["description"], "content": resp["content"]}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """Error responses are documented as problem+json only (FastAPI would add application/json)."""
    if app.openapi_schema:
        return app.openapi_schema
    doc = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    # What the middleware and the DB-outage handler may answer on any API route, documented once.
    shared = errors.problem_responses(503)
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
    app.openapi_schema = doc
    return doc


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
        LimitsAndMetrics,
        max_body_bytes=ingress.max_body_bytes,
        max_json_depth=ingress.max_json_depth,
        max_in_flight=ingress.max_in_flight,
        body_timeout_s=ingress.body_timeout_s,
    )
    app.add_middleware(AccessLog)  # outermost: it also sees what the limits answer
    return app

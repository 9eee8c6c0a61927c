"""The OpenAI-compatible HTTP server (FastAPI) over the async engine.

Routes: POST /v1/chat/completions, POST /v1/completions (both with SSE streaming), POST /tokenize
and /detokenize (vLLM's shapes), GET /v1/models, GET /health, GET /metrics (Prometheus). Every error is an OpenAI-style `{"error": {...}}` body;
a bad request never stops the server and never affects another request. A client that goes
away aborts its request, streaming or not. `guard.Guard` checks the API key, then the shared front
door (`core.frontdoor`: load shedding, body size and time, JSON nesting) before any route runs.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from prometheus_client import generate_latest
from starlette.exceptions import HTTPException as StarletteHTTPException

from core import jsonlimits
from inference.engine.async_engine import AsyncEngine, EngineDeadError
from inference.server import openapi
from inference.server.guard import Guard, ServerLimits
from inference.server.protocol import (
    OpenAIError,
    OpenAIServing,
    finish_reason,
    message_of,
    mm_inputs,
    new_request_id,
    usage,
)
from inference.server.telemetry import ServerMetrics, record_request


def _error(exc: OpenAIError, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse(exc.body(), status_code=exc.status, headers=headers)


class ClientGone(Exception):
    """The client of a non-streaming request disconnected: its generation was aborted."""


def build_app(engine: AsyncEngine, serving: OpenAIServing, limits: ServerLimits | None = None) -> FastAPI:
    limits = limits or ServerLimits()
    app = FastAPI(title="dayzero inference", docs_url=None, redoc_url=None)
    app.add_middleware(Guard, limits=limits, ready=lambda: engine.alive)
    metrics = ServerMetrics(engine.stats)
    app.state.engine = engine
    app.state.serving = serving

    @app.exception_handler(OpenAIError)
    async def _openai_error(req: Request, exc: OpenAIError) -> JSONResponse:
        metrics.requests.labels("error").inc()
        started = getattr(req.state, "started_ns", None) or time.time_ns()
        record_request(req.headers, req.url.path, started, None, serving.model_name, error=str(exc))
        return _error(exc)

    def _finished(request: Request, route: str, last: Any) -> None:
        metrics.observe(last)
        record_request(request.headers, route, request.state.started_ns, last, serving.model_name)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(_req: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        # Starlette's own headers (a 405's `Allow`) are kept.
        return _error(
            OpenAIError(str(exc.detail), status=exc.status_code, type=kind), dict(exc.headers or {})
        )

    @app.exception_handler(Exception)
    async def _internal(_req: Request, exc: Exception) -> JSONResponse:
        return _error(OpenAIError(f"internal error: {exc}", status=500, type="server_error"))

    async def _body(request: Request) -> Any:
        raw = await request.body()
        try:
            return jsonlimits.loads(raw, limits.max_json_depth)
        except ValueError as exc:  # bad JSON, too deep, bad encoding
            raise OpenAIError(f"the request body is not valid JSON: {exc}") from None

    async def _submit(prompt, sampling, **kw) -> tuple[AsyncIterator, Any]:
        if not engine.alive:
            raise OpenAIError("the engine is not running", status=503, type="server_error")
        gen = engine.generate(prompt, sampling, request_id=new_request_id(), **kw)
        try:
            first = await gen.__anext__()
        except ValueError as exc:
            raise OpenAIError(
                str(exc), code="context_length_exceeded" if "context" in str(exc) else None
            ) from None
        except EngineDeadError as exc:
            raise OpenAIError(str(exc), status=503, type="server_error") from None
        except RuntimeError as exc:
            raise OpenAIError(str(exc), status=500, type="server_error") from None
        return gen, first

    async def _collect(request: Request, gen: AsyncIterator, first: Any) -> list:
        """All outputs of a non-streaming request; aborted (ClientGone) if its client disconnects."""

        async def collect() -> list:
            outs = [first]
            while not outs[-1].finished:
                outs.append(await gen.__anext__())
            return outs

        async def disconnected() -> None:
            while (await request.receive())["type"] != "http.disconnect":
                pass

        work, watch = asyncio.ensure_future(collect()), asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not work.done():
                work.cancel()
                await asyncio.gather(work, return_exceptions=True)
                await gen.aclose()  # aborts the request: its blocks and slot go back now
        if work.cancelled():
            metrics.requests.labels("aborted").inc()
            raise ClientGone
        return work.result()

    @app.exception_handler(ClientGone)
    async def _gone(_req: Request, _exc: ClientGone) -> JSONResponse:
        return JSONResponse({"error": {"message": "client disconnected", "type": "aborted"}}, status_code=499)

    @app.post("/v1/chat/completions", openapi_extra=openapi.operation(openapi.CHAT_REQUEST))
    async def chat(request: Request):
        request.state.started_ns = time.time_ns()
        t0 = time.perf_counter()
        body = await _body(request)
        parse_ms = (time.perf_counter() - t0) * 1000.0
        p = await asyncio.to_thread(serving.prepare_chat, body)  # images are encoded here: off the loop
        p.timings_ms["parse_ms"] = parse_ms
        gen, first = await _submit(
            p.prompt_token_ids,
            p.sampling,
            mm_spans=p.mm_spans,
            mm_inputs=mm_inputs(p),
            message_ends=p.message_ends,
            prefix_link=p.prefix_link,
            handover=True,  # the prompt list is the engine's from here on (`Request`)
        )
        if not p.stream:
            outs = await _collect(request, gen, first)
            _finished(request, "/v1/chat/completions", outs[-1])
            return serving.chat_response(first.request_id, outs, p)

        async def events() -> AsyncIterator[str]:
            rid, created = first.request_id, int(time.time())
            stream = serving.stream_parser(p)
            yield serving.chat_chunk(rid, created, {"role": "assistant", "content": ""})
            o = first
            while True:
                delta = stream.push(o.new_text)
                if delta:
                    yield serving.chat_chunk(rid, created, delta)
                if o.finished:
                    break
                o = await gen.__anext__()
            final, parsed = stream.finish()
            msg, errors = message_of(parsed)
            if errors:  # what was wrong with the model's tool calls (never its raw markup)
                final["dayzero_tool_call_errors"] = errors
            yield serving.chat_chunk(rid, created, final, finish_reason(msg, o))
            if p.include_usage:
                yield serving.chat_chunk(rid, created, None, usage_=usage(o))
            _finished(request, "/v1/chat/completions", o)
            yield "data: [DONE]\n\n"

        return StreamingResponse(_closing(gen, events()), media_type="text/event-stream")

    @app.post("/v1/completions", openapi_extra=openapi.operation(openapi.COMPLETION_REQUEST))
    async def completions(request: Request):
        request.state.started_ns = time.time_ns()
        ids, sampling, stream = serving.prepare_completion(await _body(request))
        gen, first = await _submit(ids, sampling)
        if not stream:
            outs = await _collect(request, gen, first)
            _finished(request, "/v1/completions", outs[-1])
            return serving.completion_response(first.request_id, outs, sampling)

        async def events() -> AsyncIterator[str]:
            created, o = int(time.time()), first
            while True:
                if o.new_text or o.finished:
                    yield serving.completion_chunk(
                        o.request_id, created, o.new_text, o.finish_reason if o.finished else None
                    )
                if o.finished:
                    break
                o = await gen.__anext__()
            _finished(request, "/v1/completions", o)
            yield "data: [DONE]\n\n"

        return StreamingResponse(_closing(gen, events()), media_type="text/event-stream")

    @app.post("/tokenize", openapi_extra=openapi.operation(openapi.TOKENIZE_REQUEST))
    async def tokenize(request: Request):
        body = await _body(request)
        return await asyncio.to_thread(serving.tokenize, body)  # a long chat renders off the loop

    @app.post("/detokenize", openapi_extra=openapi.operation(openapi.DETOKENIZE_REQUEST))
    async def detokenize(request: Request):
        return serving.detokenize(await _body(request))

    @app.get("/v1/models")
    async def models():
        return {
            "object": "list",
            "data": [
                {
                    "id": serving.model_name,
                    "object": "model",
                    "created": 0,
                    "owned_by": "dayzero",
                    "max_model_len": serving.max_model_len,
                }
            ],
        }

    @app.get(
        "/health",
        responses={503: {"description": "the engine is not running", "content": {"application/json": {}}}},
    )
    async def health():
        if not engine.alive:
            return JSONResponse({"status": "engine not running"}, status_code=503)
        return {"status": "ok"}

    @app.get(
        "/metrics",
        responses={
            200: {
                "description": "Prometheus text format",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    async def prom():
        return PlainTextResponse(
            generate_latest(metrics.registry).decode(), media_type="text/plain; version=0.0.4"
        )

    return app


async def _closing(gen: AsyncIterator, events: AsyncIterator[str]) -> AsyncIterator[str]:
    """Run `events`; however it ends (client gone included), close the engine stream: abort.
    An engine failure mid-stream becomes a final OpenAI-style error event."""
    try:
        async for e in events:
            yield e
    except RuntimeError as exc:
        err = OpenAIError(str(exc), status=500, type="server_error")
        yield "data: " + json.dumps(err.body()) + "\n\n"
        yield "data: [DONE]\n\n"
    finally:
        await gen.aclose()

"""The front door of both HTTP servers (the REST API and the inference server): one pure ASGI
middleware that runs before any route and decides, in this order:

1. paths exempt from everything (health probes, metrics) pass straight through: a probe must
   answer while the process is overloaded;
2. a process that is draining or not ready answers 503 + `Retry-After`;
3. load shedding: at most `max_in_flight` requests are served at once and at most `max_queue`
   wait for a slot; a request that finds the queue full, whose estimated wait is longer than
   `max_queue_wait_s`, or that waited that long, is answered 429 + `Retry-After` at once, before
   its body is read. Admitted requests are never touched: they keep their slot to the end (a
   streamed response's last byte). Bounding the wait bounds the latency of what is accepted;
   an unbounded queue (the kernel's accept queue, a thread pool's) only moves the wait where
   nobody can shed it;
4. the body: its size counted as it arrives (413, a lying Content-Length included), the time
   between its pieces (408), and the nesting of a JSON body checked on the raw bytes before any
   parser recurses into it (400); the app then receives the body in one piece.

What an answer looks like is the server's (problem+json for REST, OpenAI errors for inference):
it passes a `render` function. Imports nothing of ours but `core.jsonlimits`.
"""

from __future__ import annotations

import asyncio
import collections
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core import jsonlimits

BODY_METHODS = ("POST", "PUT", "PATCH")


@dataclass(frozen=True, slots=True)
class FrontDoorLimits:
    """The limits of one server process (settings data; 0 turns a bound off where noted)."""

    max_body_bytes: int = 32 * 1024 * 1024
    max_json_depth: int = 32
    body_timeout_s: float = 30.0  # longest wait for the next piece of a body
    max_in_flight: int = 0  # requests served at once; 0 = no shedding
    max_queue: int = 0  # requests waiting for a slot (past it: 429 at once)
    max_queue_wait_s: float = 1.0  # longest (estimated or actual) wait for a slot
    retry_after_s: int = 1  # the least Retry-After of a 429 / 503
    exempt_prefixes: tuple[str, ...] = ()  # never shed, never limited (probes, metrics)
    uncounted: tuple[str, ...] = ()  # path prefixes or suffixes not counted (long-lived streams)
    streamed_prefixes: tuple[str, ...] = ()  # bodies these routes read and limit themselves

    def __post_init__(self) -> None:
        if self.max_body_bytes < 1024 or self.max_json_depth < 4:
            raise ValueError("max_body_bytes must be >= 1024 and max_json_depth >= 4")
        if min(self.max_in_flight, self.max_queue) < 0 or self.max_queue_wait_s < 0:
            raise ValueError("max_in_flight, max_queue and max_queue_wait_s must be >= 0")
        if self.body_timeout_s <= 0 or self.retry_after_s < 1:
            raise ValueError("body_timeout_s must be > 0 and retry_after_s >= 1")


@dataclass(frozen=True, slots=True)
class Refusal:
    """What the front door answers instead of the app."""

    status: int
    code: str  # a short machine-readable reason: overloaded, draining, body-too-large, ...
    message: str
    retry_after_s: int | None = None


# render(status, code, message, path) -> (content type, body)
Render = Callable[[int, str, str, str], tuple[str, bytes]]
# observe(scope, status, seconds since the request arrived): metrics
Observe = Callable[[dict, int, float], None]


class Admission:
    """Slots and a bounded FIFO queue for them, on one event loop. The wait estimate is the
    queue's length in rounds of `max_in_flight` times the recent mean time a slot is held."""

    def __init__(self, max_in_flight: int, max_queue: int, max_wait_s: float) -> None:
        self.max_in_flight, self.max_queue, self.max_wait_s = max_in_flight, max_queue, max_wait_s
        self.in_flight = 0
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()
        self.hold_s = 0.0  # exponentially weighted mean time a slot is held

    @property
    def queued(self) -> int:
        return len(self._waiters)

    def estimated_wait_s(self, position: int) -> float:
        return math.ceil(position / self.max_in_flight) * self.hold_s

    async def acquire(self) -> Refusal | None:
        """Take a slot (None), or the refusal to answer."""
        if self.in_flight < self.max_in_flight and not self._waiters:
            self.in_flight += 1
            return None
        position = len(self._waiters) + 1
        est = self.estimated_wait_s(position)
        if position > self.max_queue or est > self.max_wait_s:
            return self._refusal(f"{self.in_flight} requests in flight and {position - 1} waiting", est)
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), self.max_wait_s)
        except TimeoutError:
            if fut.done():  # the slot came at the last moment: take it
                return None
            fut.cancel()
            self._waiters.remove(fut)
            return self._refusal(f"no slot within {self.max_wait_s:g} s", self.max_wait_s)
        except asyncio.CancelledError:  # the client went away while waiting
            if fut.done() and not fut.cancelled():
                self.release(None)
            else:
                fut.cancel()
                self._waiters.remove(fut)
            raise
        return None  # the releasing request handed its slot over (in_flight unchanged)

    def release(self, held_s: float | None) -> None:
        if held_s is not None:
            self.hold_s = held_s if self.hold_s == 0.0 else 0.9 * self.hold_s + 0.1 * held_s
        while self._waiters:
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)  # the slot passes to the next waiter
                return
        self.in_flight -= 1

    def _refusal(self, why: str, wait_s: float) -> Refusal:
        return Refusal(
            429, "overloaded", f"over capacity ({why}); retry after the Retry-After seconds",
            retry_after_s=max(1, math.ceil(wait_s)),
        )  # fmt: skip


class FrontDoor:
    """The middleware (see the module docstring). `ready()` False answers 503 to every counted
    request; `draining` does the same once set (a process that is shutting down)."""

    def __init__(
        self,
        app: Any,
        limits: FrontDoorLimits,
        render: Render,
        *,
        ready: Callable[[], bool] | None = None,
        observe: Observe | None = None,
        on_refusal: Callable[[Refusal], None] | None = None,
        close_on: tuple[int, ...] = (408, 413),
    ) -> None:
        self.app, self.limits, self.render = app, limits, render
        self.ready, self.observe, self.on_refusal = ready, observe, on_refusal
        self.close_on = close_on
        self.draining = False
        lim = limits
        self.admission = (
            Admission(lim.max_in_flight, lim.max_queue, lim.max_queue_wait_s) if lim.max_in_flight else None
        )

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        path: str = scope["path"]
        lim = self.limits
        if path.startswith(lim.exempt_prefixes) if lim.exempt_prefixes else False:
            await self.app(scope, receive, self._observing(scope, send, t0))
            return
        if self.draining or (self.ready is not None and not self.ready()):
            why = "draining" if self.draining else "not ready"
            await self._refuse(
                scope, send, t0, Refusal(503, "unavailable", f"the server is {why}", lim.retry_after_s)
            )
            return
        counted = self.admission is not None and not (
            lim.uncounted and (path.startswith(lim.uncounted) or path.endswith(lim.uncounted))
        )
        if counted:
            assert self.admission is not None
            refusal = await self.admission.acquire()
            if refusal is not None:
                await self._refuse(scope, send, t0, refusal)
                return
        held = time.perf_counter()
        try:
            await self._limited(scope, receive, send, t0)
        finally:
            if counted:
                assert self.admission is not None
                self.admission.release(time.perf_counter() - held)

    async def _limited(self, scope: dict, receive: Any, send: Any, t0: float) -> None:
        lim = self.limits
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > lim.max_body_bytes:
                await self._refuse(scope, send, t0, self._too_large())
                return
        if scope["method"] not in BODY_METHODS or (
            lim.streamed_prefixes and scope["path"].startswith(lim.streamed_prefixes)
        ):
            await self.app(scope, receive, self._observing(scope, send, t0))
            return
        chunks, seen = [], 0
        while True:
            try:  # a body shorter than its Content-Length must not hold the connection for ever
                msg = await asyncio.wait_for(receive(), lim.body_timeout_s)
            except TimeoutError:
                refusal = Refusal(
                    408, "body-timeout", f"no request body arrived for {lim.body_timeout_s:g} s"
                )
                await self._refuse(scope, send, t0, refusal)
                return
            if msg["type"] != "http.request":
                return  # the client went away
            chunk = msg.get("body", b"")
            seen += len(chunk)
            if seen > lim.max_body_bytes:
                await self._refuse(scope, send, t0, self._too_large())
                return
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        try:
            jsonlimits.check_depth(body, lim.max_json_depth)
        except jsonlimits.JSONTooDeep as exc:
            await self._refuse(scope, send, t0, Refusal(400, "body-too-deep", str(exc)))
            return
        sent = False

        async def replay() -> dict:
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # after the body: wait for the disconnect, as the server would

        await self.app(scope, replay, self._observing(scope, send, t0))

    def _too_large(self) -> Refusal:
        return Refusal(
            413, "body-too-large", f"request bodies are limited to {self.limits.max_body_bytes} bytes"
        )

    def _observing(self, scope: dict, send: Any, t0: float) -> Any:
        if self.observe is None:
            return send
        observe = self.observe

        async def observing_send(msg: dict) -> None:
            if msg["type"] == "http.response.start":
                observe(scope, msg["status"], time.perf_counter() - t0)
            await send(msg)

        return observing_send

    async def _refuse(self, scope: dict, send: Any, t0: float, r: Refusal) -> None:
        if self.on_refusal is not None:
            self.on_refusal(r)
        content_type, body = self.render(r.status, r.code, r.message, scope["path"])
        headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(body)).encode())]
        if r.retry_after_s is not None:
            headers.append((b"retry-after", str(r.retry_after_s).encode()))
        if r.status in self.close_on:  # the rest of the body will not be read
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": r.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        if self.observe is not None:
            self.observe(scope, r.status, time.perf_counter() - t0)

"""The asyncio front: the engine loop runs in one background thread; callers stream outputs.

Every engine mutation happens in the engine thread (requests and aborts are queued to it), so the
scheduler and cache need no locks. `generate` is an async iterator of `RequestOutput` deltas;
leaving it early (client gone, task cancelled) aborts the request, which frees its KV blocks and
state slot at the next loop turn. `generate_sync` serves threads (the embedded client).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future
from typing import Any

from inference.engine.engine import Engine, RequestOutput

log = logging.getLogger(__name__)
Sink = Callable[[RequestOutput | BaseException], None]


class EngineDeadError(RuntimeError):
    pass


class AsyncEngine:
    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._inbox: queue.SimpleQueue[tuple[str, Any]] = queue.SimpleQueue()
        self._sinks: dict[str, Sink] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> AsyncEngine:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="dayzero-engine", daemon=True)
            self._thread.start()
        return self

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stop.set()
        self._inbox.put(("wake", None))
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive() and self.error is None

    # -- requests --------------------------------------------------------------------------
    def submit(self, sink: Sink, prompt_token_ids: list[int], sampling: Any, **kw: Any) -> Future[str]:
        """Queue a request; the future resolves to its id once the engine accepted it (or raises
        the ValueError that rejected it). `sink` receives every output (in the engine thread)."""
        if not self.alive:
            raise EngineDeadError(f"the engine is not running ({self.error!r})")
        fut: Future[str] = Future()
        self._inbox.put(("add", (fut, sink, prompt_token_ids, sampling, kw)))
        return fut

    def abort(self, request_id: str) -> None:
        self._inbox.put(("abort", request_id))

    async def generate(
        self, prompt_token_ids: list[int], sampling: Any, **kw: Any
    ) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        q: asyncio.Queue[RequestOutput | BaseException] = asyncio.Queue()

        def sink(o: RequestOutput | BaseException) -> None:
            loop.call_soon_threadsafe(q.put_nowait, o)

        rid = await asyncio.wrap_future(self.submit(sink, prompt_token_ids, sampling, **kw))
        finished = False
        try:
            while True:
                o = await q.get()
                if isinstance(o, BaseException):
                    raise o
                finished = o.finished
                yield o
                if finished:
                    return
        finally:
            if not finished:
                self.abort(rid)

    def generate_sync(
        self, prompt_token_ids: list[int], sampling: Any, timeout: float | None = None, **kw: Any
    ):
        """Block until the request finishes; returns (request id, list of outputs)."""
        q: queue.SimpleQueue[RequestOutput | BaseException] = queue.SimpleQueue()
        rid = self.submit(q.put, prompt_token_ids, sampling, **kw).result(timeout)
        outs = []
        try:
            while True:
                o = q.get(timeout=timeout)
                if isinstance(o, BaseException):
                    raise o
                outs.append(o)
                if o.finished:
                    return rid, outs
        except BaseException:
            self.abort(rid)
            raise

    def stats(self) -> dict[str, float]:
        return self.engine.stats()

    # -- the engine thread -----------------------------------------------------------------
    def _handle(self, kind: str, item: Any) -> None:
        if kind == "add":
            fut, sink, prompt, sampling, kw = item
            if not fut.set_running_or_notify_cancel():
                return
            try:
                rid = self.engine.add_request(prompt, sampling, **kw)
            except Exception as exc:  # rejected: report to the caller, keep serving
                fut.set_exception(exc)
                return
            self._sinks[rid] = sink
            fut.set_result(rid)
        elif kind == "abort":
            for o in self.engine.abort([item]):
                self._deliver(o)

    def _deliver(self, o: RequestOutput) -> None:
        sink = self._sinks.get(o.request_id)
        if sink is not None:
            sink(o)
        if o.finished:
            self._sinks.pop(o.request_id, None)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                block = not self.engine.has_unfinished
                kind, item = self._inbox.get(timeout=0.5) if block else self._inbox.get_nowait()
                self._handle(kind, item)
                continue  # drain the inbox before stepping
            except queue.Empty:
                pass
            if not self.engine.has_unfinished:
                continue
            try:
                outputs = self.engine.step()
            except Exception as exc:  # a failed step fails the request that broke it, no other
                log.exception("engine step failed")
                self._fail_step(exc)
                continue
            for o in outputs:
                self._deliver(o)

    def _fail_step(self, exc: Exception) -> None:
        try:
            failed = self.engine.recover_after_failed_step()
        except Exception as inner:  # the engine cannot recover: stop serving, say why
            self.error = inner
            self._stop.set()
            failed = list(self._sinks)
        err = RuntimeError(f"engine step failed: {exc}")
        for rid in failed:
            sink = self._sinks.pop(rid, None)
            if sink is not None:
                sink(err)

"""Where tool and preprocess jobs run: in-process threads (embedded default) or Celery queues.

Both implementations take the same typed payloads (`core.payloads`) and return the same outcomes, so the runner
does not know which one it has. Retries are never done here: each call is one attempt.
"""

from __future__ import annotations

import concurrent.futures as cf
import datetime as dt
import logging
import queue
import threading
import time
from contextlib import suppress
from typing import Any, Protocol

from core.outage import OutageOutlasted, wait_out
from core.payloads import PreprocessJob, ToolJob, unknown_outcome
from tools.base import ErrorKind
from workers.liveness import JobWatch

log = logging.getLogger(__name__)

_CANCEL_POLL_S = 0.25  # how often a wait for a tool job looks at its task's cancel signal
_LIVENESS_POLL_S = 1.0  # how often it looks at its worker's liveness (`workers.liveness`)


class _Cancelled(Exception):
    """The task was cancelled while its tool job ran (raised out of Celery's wait)."""


class _WorkerLost(Exception):
    """The worker running the tool job died (raised out of Celery's wait)."""


def timeout_outcome(job: ToolJob, started: float) -> dict[str, Any]:
    """No result within the attempt's time: the job may have run (or may still), so its retry
    reuses this attempt's idempotency key (`core.payloads.idempotency_key`)."""
    error = {"error": f"tool timed out after {job.timeout_s:g} s", "kind": ErrorKind.TIMEOUT.value}
    return {
        "ok": False,
        "error": unknown_outcome(error, job.idempotency_key),
        "duration_ms": (time.perf_counter() - started) * 1000,
    }


def not_sent_outcome(queue: str, reason: BaseException) -> dict[str, Any]:
    """The job never reached its queue (the broker was away until the attempt's deadline): it
    is known not to have run, so even a tool that is not safe to repeat may be tried again."""
    return {
        "ok": False,
        "error": {
            "error": f"the job could not be sent to the {queue} queue ({reason}); it did not run",
            "kind": ErrorKind.RETRYABLE.value,
            "started": False,
            "code": "queue_unavailable",
        },
    }


def worker_lost_outcome(job: ToolJob, started: float) -> dict[str, Any]:
    """The worker running the job died (`workers.liveness`): retryable, but the job may have
    begun its side effect, so only a tool that is safe to repeat runs again (same key)."""
    error = {
        "error": "the worker running the tool was lost (it stopped while the tool ran)",
        "kind": ErrorKind.RETRYABLE.value,
        "code": "worker_lost",
    }
    return {
        "ok": False,
        "error": unknown_outcome(error, job.idempotency_key),
        "duration_ms": (time.perf_counter() - started) * 1000,
    }


def cancelled_outcome() -> dict[str, Any]:
    return {
        "ok": False,
        "error": {"error": "the task was cancelled while the tool ran", "kind": ErrorKind.PERMANENT.value},
        "cancelled": True,
    }


class Dispatcher(Protocol):
    def run_tool(self, job: ToolJob, cancel: threading.Event | None = None) -> dict[str, Any]:
        """Run one tool attempt; waits at most `job.timeout_s`, then returns a timeout outcome.
        Once `cancel` is set it stops waiting (revoking the job where it can) and returns
        `cancelled_outcome()`."""
        ...

    def preprocess(self, job: PreprocessJob, timeout_s: float) -> dict[str, Any]:
        """Preprocess one attachment (see `workers.jobs.preprocess_attachment`)."""
        ...

    def close(self) -> None: ...


class InProcessDispatcher:
    """Thread pool in this process. A hung in-process tool cannot be killed, only abandoned at its
    timeout; tools that run untrusted code (the `python` sandbox) enforce their own kill."""

    def __init__(self, registry: Any = None, max_workers: int = 8):
        self._registry = registry
        self._pool = cf.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="dayzero-job")

    def run_tool(self, job: ToolJob, cancel: threading.Event | None = None) -> dict[str, Any]:
        from workers.tool_jobs import run_tool

        if self._inline(job.tool):
            return run_tool(job, self._registry)
        started = time.perf_counter()
        until = time.monotonic() + job.timeout_s
        fut = self._pool.submit(run_tool, job, self._registry)
        while True:  # in slices, to see a cancel; the thread is abandoned (it cannot be killed)
            try:
                return fut.result(timeout=max(0.0, min(_CANCEL_POLL_S, until - time.monotonic())))
            except cf.TimeoutError:
                if cancel is not None and cancel.is_set():
                    fut.cancel()
                    return cancelled_outcome()
                if time.monotonic() >= until:
                    fut.cancel()
                    return timeout_outcome(job, started)

    def preprocess(self, job: PreprocessJob, timeout_s: float) -> dict[str, Any]:
        from workers.jobs import preprocess_attachment

        return self._pool.submit(preprocess_attachment, job).result(timeout=timeout_s)

    def _inline(self, tool: str) -> bool:
        """Whether the tool declared itself `inline`; an unknown tool is not (the pool thread
        reports it as the tool's error, as before)."""
        from tools.base import ToolError
        from workers.tool_jobs import process_registry

        try:
            return (self._registry or process_registry()).spec(tool).inline
        except ToolError:
            return False

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class CeleryDispatcher:
    """Celery queues `tools` and `preprocess`; results come back through the result backend.

    A result is read once, by the runner waiting for it, and then deleted: off the waiting path,
    by a background thread (the delete is one more round trip to the backend per job), so a
    result lives milliseconds, not the backend's expiry (`result_expires` bounds the unread)."""

    def __init__(self, broker_url: str, result_backend: str | None, *, app: Any = None):
        from workers.celery_app import make_celery_app

        self._app = app if app is not None else make_celery_app(broker_url, result_backend or broker_url)
        self._read: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._forgetter = threading.Thread(target=self._forget_read, name="dayzero-forget", daemon=True)
        self._forgetter.start()

    def _forget_read(self) -> None:
        while (res := self._read.get()) is not None:
            try:
                res.forget()
            except Exception:  # the backend is away: the result expires instead
                log.warning("could not delete the result of %s", res.id, exc_info=True)

    def run_tool(self, job: ToolJob, cancel: threading.Event | None = None) -> dict[str, Any]:
        """One attempt. A broker or result backend that is down or restarting is waited out
        within the attempt's timeout (`core.outage`): a send that failed is known not to have
        happened (`not_sent_outcome`), never an error that ends the runner."""
        from celery.exceptions import TaskRevokedError
        from celery.exceptions import TimeoutError as CeleryTimeout

        started = time.perf_counter()
        until = time.monotonic() + job.timeout_s
        deadline = job.not_after
        expires = dt.datetime.fromtimestamp(deadline, dt.UTC) if deadline is not None else None

        def send() -> Any:
            with _publish_span("tools", "dayzero.run_tool"):  # its context rides in the Celery headers
                return self._app.send_task(
                    "dayzero.run_tool", args=[job.to_dict()], queue="tools", expires=expires
                )

        try:
            res = wait_out("tool queue", send, deadline=until)
        except OutageOutlasted as exc:
            return not_sent_outcome("tools", exc.last)

        watch = JobWatch(self._app, res.id)

        def wait_for_result() -> Any:
            # In slices, to see a cancel and a lost worker: Celery's own wait cannot be interrupted.
            while True:
                if cancel is not None and cancel.is_set():
                    raise _Cancelled
                left = until - time.monotonic()
                if left <= 0:
                    raise CeleryTimeout("the job's time is up")
                slice_s = _CANCEL_POLL_S if cancel is not None else _LIVENESS_POLL_S
                try:
                    return res.get(timeout=min(left, slice_s), propagate=True)
                except CeleryTimeout:
                    if watch.lost():  # asked only of a job slower than one slice
                        raise _WorkerLost from None

        try:
            return wait_out("tool result backend", wait_for_result, deadline=until)
        except _Cancelled:
            with suppress(Exception):  # the late result, if any, is never read
                res.revoke(terminate=True)
            return cancelled_outcome()
        except _WorkerLost:
            log.warning("tool job %s (%s): its worker was lost; the attempt fails", res.id, job.tool)
            with suppress(Exception):  # a late redelivery is refused by the fence anyway
                res.revoke()
            return worker_lost_outcome(job, started)
        except TaskRevokedError as exc:
            # Expired before a worker took it (a broker restart held it back) or terminated while
            # it ran: a failed attempt whose side effect may have begun (`started` unknown).
            error = {"error": f"the job was revoked: {exc}", "kind": ErrorKind.RETRYABLE.value}
            return {"ok": False, "error": unknown_outcome(error, job.idempotency_key)}
        except (CeleryTimeout, OutageOutlasted):
            with suppress(Exception):  # the broker may still be away: the job's `expires` bounds it
                res.revoke(terminate=True)
            return timeout_outcome(job, started)
        finally:
            self._read.put(res)

    def preprocess(self, job: PreprocessJob, timeout_s: float) -> dict[str, Any]:
        with _publish_span("preprocess", "dayzero.preprocess_attachment"):
            res = self._app.send_task(
                "dayzero.preprocess_attachment", args=[job.to_dict()], queue="preprocess"
            )
        try:
            return res.get(timeout=timeout_s, propagate=True)
        finally:
            self._read.put(res)

    def close(self) -> None:
        self._read.put(None)  # the results read so far are deleted first
        self._forgetter.join(timeout=5)
        self._app.close()


def _publish_span(queue: str, task_name: str) -> Any:
    from opentelemetry.trace import SpanKind

    from orchestrator.tracing import tracer

    return tracer.start_as_current_span(
        f"{task_name} publish",
        kind=SpanKind.PRODUCER,
        attributes={
            "messaging.system": "celery",
            "messaging.operation.type": "publish",
            "messaging.destination.name": queue,
        },
    )


def make_dispatcher(
    celery_broker_url: str | None, celery_result_backend: str | None, registry: Any = None
) -> Dispatcher:
    if celery_broker_url:
        return CeleryDispatcher(celery_broker_url, celery_result_backend)
    return InProcessDispatcher(registry)

"""The Celery app: queues `preprocess` and `tools`, routing, at-least-once delivery, trace headers.

Delivery: tasks ack late (after they finish) and are rejected back to the queue when the worker
process dies, so a job killed mid-run is redelivered. Each job is idempotent (content-addressed
results; tools carry an idempotency key), so a redelivery completes it once. On Redis, a message
whose worker vanished entirely comes back after the visibility timeout, which is therefore longer
than the longest hard time limit: a shorter one would redeliver jobs that are still running.
That makes a redelivery late (~76 min by default) — long after the runner recorded a timeout and
moved on — so a tool job checks before it runs that its attempt is still current and still
leased (`workers.fence`), and its message expires when the runner stops waiting for it. (On RabbitMQ the broker redelivers when the connection drops;
its `consumer_timeout` must likewise exceed the longest job.)

A worker that dies whole leaves its message unacked until that timeout, so a running tool job
also keeps a short-lived liveness key fresh (`workers.liveness`): the runner waiting for it sees
the worker gone within seconds and retries the attempt under the orchestrator's policy.

Retries: Celery autoretry is off and publish retries are off. The orchestrator owns retry policy
(STYLE.md rule 13), so each attempt is a row it can see.

Tracing: the W3C `traceparent` (and `tracestate`) of the caller's current span rides in the
message headers and is attached as the current context while the task runs.

`celery -A workers.celery_app worker -Q preprocess` uses the module-level `app`, built from
`CELERY_BROKER_URL` / `CELERY_RESULT_BACKEND`.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from celery import Celery
from celery.signals import (
    before_task_publish,
    task_postrun,
    task_prerun,
    worker_process_init,
    worker_process_shutdown,
    worker_shutdown,
)
from kombu import Queue

from workers import redis_transport

PREPROCESS_QUEUE = "preprocess"
TOOLS_QUEUE = "tools"
PREPROCESS_TASK = "dayzero.preprocess_attachment"
RUN_TOOL_TASK = "dayzero.run_tool"

# Hard limits are a backstop only: the orchestrator enforces per-attempt timeouts itself.
PREPROCESS_SOFT_LIMIT_S = 120
PREPROCESS_HARD_LIMIT_S = 180
TOOLS_HARD_LIMIT_S = 3600
LONGEST_JOB_S = max(PREPROCESS_HARD_LIMIT_S, TOOLS_HARD_LIMIT_S)
# A message is redelivered by Redis only after this long without an ack: must exceed the longest job.
DEFAULT_VISIBILITY_TIMEOUT_S = int(LONGEST_JOB_S * 1.25) + 60

TRACE_HEADERS = ("traceparent", "tracestate")


def _default_result_backend(broker_url: str) -> str:
    if broker_url.startswith(("redis://", "rediss://")):
        return broker_url
    if broker_url.startswith("memory://"):
        return "cache+memory://"
    return "rpc://"


def make_celery_app(
    broker_url: str,
    result_backend: str | None = None,
    *,
    visibility_timeout_s: float | None = None,
    broker_transport_options: dict[str, Any] | None = None,
    main: str = "dayzero",
) -> Celery:
    """A configured Celery app with the dayzero tasks registered (tests pass short timeouts here)."""
    visibility = float(visibility_timeout_s or DEFAULT_VISIBILITY_TIMEOUT_S)
    transport = {"visibility_timeout": visibility, **(broker_transport_options or {})}
    app = Celery(main, broker=broker_url, backend=result_backend or _default_result_backend(broker_url))
    if broker_url.startswith(("redis://", "rediss://")):  # see workers.redis_transport
        app.conf.broker_transport = redis_transport.TRANSPORT
    app.conf.update(
        task_serializer="json",
        result_serializer="json",
        accept_content=["json"],
        result_accept_content=["json"],
        task_queues=(
            Queue(PREPROCESS_QUEUE, routing_key=PREPROCESS_QUEUE),
            Queue(TOOLS_QUEUE, routing_key=TOOLS_QUEUE),
        ),
        task_routes={
            PREPROCESS_TASK: {"queue": PREPROCESS_QUEUE, "routing_key": PREPROCESS_QUEUE},
            RUN_TOOL_TASK: {"queue": TOOLS_QUEUE, "routing_key": TOOLS_QUEUE},
        },
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        task_acks_on_failure_or_timeout=True,  # a job that raised is finished, not redelivered
        worker_prefetch_multiplier=1,
        worker_cancel_long_running_tasks_on_connection_loss=True,
        # No STARTED state: nothing reads it, and it costs a backend write plus a wake-up of the
        # waiting runner per job (benchmarks/dispatch.py).
        task_track_started=False,
        task_publish_retry=False,
        broker_transport_options=transport,
        result_backend_transport_options={"visibility_timeout": visibility},
        # The dispatcher deletes a result once read; this only bounds the ones nobody read (the
        # runner timed out or died), which nobody will: the longest a runner waits is a tool's
        # hard limit.
        result_expires=TOOLS_HARD_LIMIT_S,
        broker_connection_retry_on_startup=True,
        # A broker outage is waited out, however long (Celery's default gives up after 100 tries).
        broker_connection_max_retries=None,
        worker_hijack_root_logger=False,
    )
    _register_tasks(app)
    return app


def _register_tasks(app: Celery) -> None:
    @app.task(
        name=PREPROCESS_TASK,
        soft_time_limit=PREPROCESS_SOFT_LIMIT_S,
        time_limit=PREPROCESS_HARD_LIMIT_S,
        max_retries=0,
        shared=False,  # per-app: several apps in one process must not share task objects
    )
    def preprocess_attachment(payload: dict[str, Any]) -> dict[str, Any]:
        from workers import jobs

        return jobs.preprocess_attachment(payload)

    @app.task(name=RUN_TOOL_TASK, time_limit=TOOLS_HARD_LIMIT_S, max_retries=0, shared=False, bind=True)
    def run_tool(self: Any, payload: dict[str, Any]) -> dict[str, Any]:
        from workers import jobs
        from workers.fence import refuse_stale
        from workers.liveness import heartbeat

        refusal = refuse_stale(payload)  # a redelivered job whose attempt is over never runs
        if refusal is not None:
            logging.getLogger(__name__).warning(
                "tool job %s:%s:%s refused: %s",
                payload.get("task_id"),
                payload.get("step_index"),
                payload.get("attempt"),
                refusal.reason,
            )
            return refusal.outcome()
        # the waiting runner sees a dead worker in seconds
        with heartbeat(self.app, self.request.id, started_ttl_s=TOOLS_HARD_LIMIT_S):
            return jobs.run_tool(payload)


# --- trace context -------------------------------------------------------------------------------


def _propagator():
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator()


def inject_trace_headers(headers: dict[str, Any] | None = None, **_: Any) -> None:
    """`before_task_publish`: add the current span's traceparent unless the caller set one."""
    if headers is None or headers.get("traceparent"):
        return
    carrier: dict[str, str] = {}
    _propagator().inject(carrier)
    for key in TRACE_HEADERS:
        if key in carrier:
            headers[key] = carrier[key]


def _request_header(request: Any, key: str) -> str | None:
    value = getattr(request, key, None)
    if not value:
        value = (getattr(request, "headers", None) or {}).get(key)
    return str(value) if value else None


_TOKENS: dict[str, tuple[object, Any]] = {}


def attach_trace_context(task_id: str | None = None, task: Any = None, **_: Any) -> None:
    """`task_prerun`: a consumer span of the publisher's trace, current while the task runs."""
    if task is None or task_id is None:
        return
    carrier = {k: v for k in TRACE_HEADERS if (v := _request_header(task.request, k))}
    if "traceparent" not in carrier:
        return
    from opentelemetry import context, trace
    from opentelemetry.trace import SpanKind

    from workers.telemetry import install_tracer_provider

    install_tracer_provider("dayzero-worker")  # once per (pool child) process
    delivery = getattr(task.request, "delivery_info", None) or {}
    span = trace.get_tracer("dayzero.workers").start_span(
        f"{getattr(task, 'name', 'celery')} process",
        context=_propagator().extract(carrier),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "celery",
            "messaging.operation.type": "process",
            "messaging.destination.name": str(delivery.get("routing_key") or ""),
            "messaging.message.id": task_id,
            "dayzero.celery.retries": int(getattr(task.request, "retries", 0) or 0),
            "dayzero.celery.redelivered": bool(delivery.get("redelivered")),
        },
    )
    _TOKENS[task_id] = (context.attach(trace.set_span_in_context(span)), span)


def detach_trace_context(task_id: str | None = None, state: str | None = None, **_: Any) -> None:
    held = _TOKENS.pop(task_id or "", None)
    if held is not None:
        from opentelemetry import context

        token, span = held
        if state and state != "SUCCESS":
            from workers.telemetry import mark_error

            mark_error(span, state, f"celery task ended {state}")
        span.end()
        context.detach(token)


def flush_spans(**_: Any) -> None:
    """`worker_process_shutdown` / `worker_shutdown`: export what is still buffered."""
    from opentelemetry import trace

    flush = getattr(trace.get_tracer_provider(), "force_flush", None)
    if flush is not None:
        flush(5000)


before_task_publish.connect(inject_trace_headers, weak=False, dispatch_uid="dayzero.trace.inject")
task_prerun.connect(attach_trace_context, weak=False, dispatch_uid="dayzero.trace.attach")
task_postrun.connect(detach_trace_context, weak=False, dispatch_uid="dayzero.trace.detach")
worker_process_shutdown.connect(flush_spans, weak=False, dispatch_uid="dayzero.trace.flush_child")
worker_shutdown.connect(flush_spans, weak=False, dispatch_uid="dayzero.trace.flush")


# --- one thread per pool process ------------------------------------------------------------------


def one_thread_per_process(**_: Any) -> None:
    """`worker_process_init`: a prefork child works on one job at a time with one thread, so
    `--concurrency N` means N busy cores (not N x cores threads fighting over them)."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)
    import cv2

    cv2.setNumThreads(1)


worker_process_init.connect(one_thread_per_process, weak=False, dispatch_uid="dayzero.one_thread")


def app_from_env(environ: os._Environ[str] | dict[str, str] = os.environ) -> Celery:
    """Build the app from CELERY_BROKER_URL / CELERY_RESULT_BACKEND (in-memory broker if unset)."""
    broker = environ.get("CELERY_BROKER_URL") or "memory://"
    vt = environ.get("DAYZERO_CELERY_VISIBILITY_TIMEOUT_S")
    return make_celery_app(
        broker, environ.get("CELERY_RESULT_BACKEND"), visibility_timeout_s=float(vt) if vt else None
    )


app = app_from_env()

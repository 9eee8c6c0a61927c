"""The runner loop: claim a task, then execute its steps one transaction each.

Crash safety. The transaction that finishes step k also starts step k+1 (its attempt row is
written RUNNING before anything executes). A runner killed at any instant leaves either the
previous committed state or the next one; when its lease expires another runner claims the task
and finds the open step:
- RUNNING, started by someone else: the attempt is *in doubt* (it may have run). Model steps and
  tools that are idempotent or accept an idempotency key run again under the same attempt
  number, hence the same key `task_id:step_index:attempt`; other tools are not run again and the
  model is told the outcome is unknown.
- PENDING or RETRY_WAIT: a new attempt starts.
Every transaction is fenced on the lease (see `txn.StepTxn`), so a runner that lost its lease
can never write.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opentelemetry import trace
from sqlalchemy import Connection, Engine

from orchestrator.attachments import (
    PDF_MEDIA_TYPE,
    AttachmentError,
    local_blob_path,
    preprocess_config_for,
    resolve_images,
)
from orchestrator.clock import utcnow
from orchestrator.db.tables import attachments_t
from orchestrator.dispatch import Dispatcher
from orchestrator.failpoints import failpoint
from orchestrator.inference_client import InferenceClient, InferenceError, Sampling
from orchestrator.metrics import (
    ATTEMPTS_RESUMED,
    LEASES_LOST,
    MODEL_TOKENS,
    MODEL_TTFT,
    PREPROCESS_JOBS,
    STEP_RETRIES,
    STEP_SECONDS,
    TOOL_ATTEMPTS,
)
from orchestrator.probes import Backoff, Health, outage_errors
from orchestrator.retry import Decision, decide, decide_tool
from orchestrator.runner.lease import LeaseLost, claim_next_task, renew_lease
from orchestrator.runner.txn import StepTxn, StepView, TaskView
from orchestrator.statemachine import StepEvent, StepStatus, TaskEvent, TaskStatus
from orchestrator.tasks.errors import StaleTransition
from orchestrator.tasks.queries import has_unfinished_tasks, task_state
from orchestrator.tracing import current_traceparent, task_span, trace_error
from tools.base import ErrorKind, RetryPolicy, ToolError, ToolSpec
from tools.registry import ToolRegistry
from workers.fence import not_after as job_not_after
from workers.jobs import describe_error as describe_job_error

log = logging.getLogger(__name__)

_TERMINAL = (TaskStatus.SUCCEEDED, TaskStatus.FAILED, TaskStatus.CANCELLED, TaskStatus.TIMED_OUT)


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    runner_id: str = field(default_factory=lambda: f"runner-{uuid.uuid4().hex[:12]}")
    lease_s: float = 30.0
    poll_interval_s: float = 0.2
    workspace_dir: str | None = None
    # Retry backoffs shorter than this are waited out while holding the lease.
    local_wait_max_s: float = 1.0
    # Where attachment bytes live (a BlobStore URL) and how images are preprocessed.
    blob_url: str = "./.dayzero/blobs"
    preprocess: dict[str, Any] | None = None  # PreprocessConfig fields (Settings.preprocess)
    preprocess_tenants: dict[str, dict[str, Any]] | None = None  # per-tenant overrides of those
    # Attachment preprocessing: attempts, backoff (the task is parked meanwhile) and timeout.
    preprocess_retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            max_attempts=3, backoff_base_s=2.0, backoff_max_s=60.0, timeout_s=120.0
        )
    )
    model_retry: RetryPolicy = field(
        default_factory=lambda: RetryPolicy(
            max_attempts=3, backoff_base_s=0.5, backoff_max_s=10.0, timeout_s=300.0
        )
    )


class _Heartbeat:
    """Renews the lease every third of its length while a step executes."""

    def __init__(self, engine: Engine, task_id: str, runner_id: str, lease_s: float, health: Health):
        self._args = (engine, task_id, runner_id, lease_s)
        self._health = health
        self._stop = threading.Event()
        self._conn: Connection | None = None
        self.lost = False
        self._thread = threading.Thread(target=self._run, name=f"lease-{task_id[:8]}", daemon=True)

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        engine, task_id, runner_id, lease_s = self._args
        while not self._stop.wait(lease_s / 3):
            try:
                with engine.begin() as conn:
                    renew_lease(conn, task_id, runner_id, lease_s)
                self._health.beat()
            except LeaseLost:
                self.lost = True
                return
            except Exception:  # a DB blip: the next beat or the step's own commit will tell
                log.warning("lease renewal failed for %s", task_id, exc_info=True)


class Runner:
    """Executes tasks: `run_forever()` in `dayzero runner`, `run_until_idle()` in tests and `dayzero run`."""

    def __init__(
        self,
        engine: Engine,
        inference: InferenceClient,
        dispatcher: Dispatcher,
        tools: ToolRegistry,
        config: RunnerConfig | None = None,
    ):
        self.engine = engine
        self.inference = inference
        self.dispatcher = dispatcher
        self.tools = tools
        self.config = config or RunnerConfig()
        self.health = Health()  # the loop and the lease renewals beat it (a long step is alive)
        self._stop = threading.Event()

    # -- outer loop --------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run_forever(self) -> None:
        """Loop until `stop()`. A lost database connection is logged and retried with backoff: the
        lease of whatever was in flight expires and the work resumes from the last commit.
        `health` (the probes) follows: unready while the database is away."""
        backoff = Backoff()
        while not self._stop.is_set():
            try:
                worked = self.run_once()
                backoff.reset()
                self.health.set_ready()
            except outage_errors() as exc:
                delay = backoff.next_delay()
                self.health.set_unready(type(exc).__name__)
                log.warning("database error (%s); retrying in %.1f s", exc.__class__.__name__, delay)
                self._stop.wait(delay)
                continue
            if not worked:
                self._stop.wait(self.config.poll_interval_s)

    def run_until_idle(self, *, timeout_s: float = 60.0, until: Callable[[], bool] | None = None) -> None:
        """Work until no task is runnable (or `until()` holds); tasks in backoff are waited for."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if until is not None and until():
                return
            if self.run_once():
                continue
            if until is None and not self._has_unfinished_tasks():
                return
            time.sleep(self.config.poll_interval_s)
        raise TimeoutError(f"runner did not go idle within {timeout_s} s")

    def _has_unfinished_tasks(self) -> bool:
        with self.engine.connect() as conn:
            return has_unfinished_tasks(conn)

    def run_once(self) -> bool:
        """Claim one task and drive it as far as it goes; False when nothing was claimable."""
        with self.engine.begin() as conn:
            task_id = claim_next_task(conn, self.config.runner_id, self.config.lease_s)
        if task_id is None:
            return False
        try:
            self._drive(task_id)
        except (LeaseLost, StaleTransition) as exc:
            if isinstance(exc, LeaseLost):
                LEASES_LOST.inc()
            log.info("gave up task %s: %s", task_id, exc)
        return True

    # -- one task ----------------------------------------------------------------------------
    def _load(self, task_id: str) -> TaskView:
        with self.engine.connect() as conn:
            state = task_state(conn, task_id)
        t, rows, transcript = state.task, state.steps, state.messages
        atts = [
            {
                "id": a.id,
                "media_type": a.media_type,
                "sha256": a.sha256,
                "content_hash": a.content_hash,
                "processed_sha256": a.processed_sha256,
                "redaction": a.redaction,
                "tenant": a.tenant,
                "filename": a.filename,
                "status": a.status,
                "path": _tool_path(self.config.blob_url, a.sha256, a.redaction),
            }
            for a in state.attachments
        ]
        steps = {
            r.step_index: StepView(
                index=r.step_index,
                kind=r.kind,
                status=r.status,
                tool_name=r.tool_name,
                tool_call_id=r.tool_call_id,
                arguments=r.arguments,
                attempt_count=r.attempt_count,
                next_attempt_at=r.next_attempt_at,
                started_at=r.started_at,
                runner_id=r.runner_id,
            )
            for r in rows
            if r.status not in (StepStatus.SUCCEEDED, StepStatus.FAILED) or r is rows[-1]
        }
        return TaskView(
            id=t.id,
            status=t.status,
            allowed_tools=t.allowed_tools,
            sampling=t.sampling,
            max_steps=t.max_steps,
            max_tokens=t.max_tokens,
            deadline_at=t.deadline_at,
            step_count=t.step_count,
            prompt_tokens=t.prompt_tokens,
            cached_tokens=t.cached_tokens,
            completion_tokens=t.completion_tokens,
            transcript=transcript,
            steps=steps,
            next_step_index=(rows[-1].step_index + 1) if rows else 0,
            traceparent=t.traceparent,
            attachments=atts,
            cancel_requested=t.cancel_requested,
        )

    def _drive(self, task_id: str) -> None:
        task = self._load(task_id)
        # One connection for the whole drive: checked out (and pinged) once, not once per step.
        with (
            self.engine.connect() as self._conn,
            _Heartbeat(self.engine, task.id, self.config.runner_id, self.config.lease_s, self.health),
        ):
            while not self._stop.is_set() and task.status not in _TERMINAL:
                step = task.open_step()
                if task.cancel_requested or utcnow() >= task.deadline_at:
                    self._commit(self._end_if_asked(self._txn(task)))
                    continue
                if task.status == TaskStatus.PREPROCESSING:
                    with task_span(task.traceparent, "task.preprocess", {"dayzero.task_id": task.id}):
                        if not self._preprocess(task):
                            return
                    continue
                if step is not None and step.status == StepStatus.RUNNING:
                    self._execute(task, step)
                    continue
                if (
                    step is not None
                    and step.status == StepStatus.RETRY_WAIT
                    and step.next_attempt_at is not None
                ):
                    wait = (step.next_attempt_at - utcnow()).total_seconds()
                    if wait > self.config.local_wait_max_s:
                        self._park(task, step.next_attempt_at)
                        return
                    if wait > 0:
                        time.sleep(wait)
                tx = self._txn(task)
                self._advance(tx, step)
                self._commit(tx)

    def _preprocess(self, task: TaskView) -> bool:
        """Preprocess the task's pending image attachments, one transaction each; then READY.

        Returns False when the task was parked (a transient failure) or failed."""
        for att in task.attachments:
            if att["status"] != "PENDING":
                continue
            tx = self._txn(task)
            key = {"id": att["id"], "status": "PENDING"}
            if not (att["media_type"].startswith("image/") or att["media_type"] == PDF_MEDIA_TYPE):
                tx.update_row(attachments_t, key, status="READY", updated_at=tx.now)
                att["status"] = "READY"
                tx.commit(self._conn)
                continue
            payload = {
                "attachment_id": att["id"],
                "blob_sha256": att["sha256"],
                "blob_url": self.config.blob_url,
                "media_type": att["media_type"],
                "config": preprocess_config_for(
                    self.config.preprocess, self.config.preprocess_tenants, att["tenant"]
                ),
            }
            attrs = {
                "dayzero.task_id": task.id,
                "dayzero.attachment_id": att["id"],
                "dayzero.media_type": att["media_type"],
            }
            with task_span(current_traceparent() or task.traceparent, "attachment.preprocess", attrs) as span:
                payload["traceparent"] = current_traceparent() or task.traceparent  # the worker's parent
                try:
                    result = self.dispatcher.preprocess(payload, self.config.preprocess_retry.timeout_s)
                    error = None
                except Exception as exc:  # typed image errors and transport failures alike
                    result, error = None, describe_job_error(exc)
                    trace_error(span, error.get("type") or type(exc).__name__, str(exc))
                if result is not None:  # what was redacted is part of the trace, not only the row
                    for field_name in ("enabled", "faces", "documents"):
                        value = (result.get("redaction") or {}).get(field_name)
                        if value is not None:
                            span.set_attribute(f"dayzero.redaction.{field_name}", value)
            PREPROCESS_JOBS.labels("ok" if error is None else "error").inc()
            tx = self._txn(task)
            if error is None:
                redaction = {**result["redaction"], "image_sha256": result.get("redacted_sha256")}
                tx.update_row(
                    attachments_t,
                    key,
                    status="READY",
                    content_hash=result["content_hash"],
                    processed_sha256=result["processed_sha256"],
                    grid_thw=result["grid_thw"],
                    redaction=redaction,
                    updated_at=tx.now,
                )
                summary = {k: redaction.get(k) for k in ("enabled", "faces", "documents")}
                ready = {"attachment": att["id"], "grid_thw": result["grid_thw"], "redaction": summary}
                if result.get("kind") == "document":
                    ready.update(pages=result["pages"], page_images=result["page_images"])
                tx.event("attachment.ready", ready)
                att.update(
                    status="READY",
                    content_hash=result["content_hash"],
                    processed_sha256=result["processed_sha256"],
                    redaction=redaction,
                )
                tx.commit(self._conn)
                continue
            att["failures"] = att.get("failures", 0) + 1
            kind = ErrorKind.RETRYABLE if error.get("retryable") else ErrorKind.PERMANENT
            decision = decide(self.config.preprocess_retry, kind, att["failures"])  # idempotent job
            if decision.retry:
                tx.event("attachment.retry_scheduled", {"attachment": att["id"], "error": error})
                tx.set_task(
                    next_run_at=tx.now + dt.timedelta(seconds=decision.delay_s),
                    lease_owner=None,
                    lease_until=None,
                )
                tx.commit(self._conn)
                return False
            tx.update_row(attachments_t, key, status="FAILED", error=error, updated_at=tx.now)
            tx.event("attachment.failed", {"attachment": att["id"], "error": error})
            tx.task_transition(TaskEvent.FAIL, error={"kind": "attachment", "attachment": att["id"], **error})
            tx.commit(self._conn)
            return False
        tx = self._txn(task)
        tx.task_transition(TaskEvent.PREPROCESSED)
        tx.commit(self._conn)
        return True

    def _txn(self, task: TaskView) -> StepTxn:
        return StepTxn(task, self.config.runner_id, self.config.lease_s)

    def _commit(self, tx: StepTxn | None) -> None:
        if tx is not None:
            tx.commit(self._conn)

    def _park(self, task: TaskView, until: dt.datetime) -> None:
        """Release the task until its next retry is due (RUNNING → WAITING)."""
        tx = self._txn(task)
        tx.task_transition(TaskEvent.WAIT, _payload={"until": until.isoformat()})
        tx.set_task(next_run_at=until, lease_owner=None, lease_until=None)
        tx.commit(self._conn)

    def _end_if_asked(self, tx: StepTxn) -> StepTxn | None:
        """At a step boundary: honour cancellation and the deadline. Returns `tx` if the task ended."""
        task = tx.task
        if task.cancel_requested:
            self._abandon_open_steps(tx)
            tx.task_transition(
                TaskEvent.CANCEL, error={"kind": "cancelled", "message": "cancelled by request"}
            )
            return tx
        if tx.now >= task.deadline_at:
            self._abandon_open_steps(tx)
            tx.task_transition(
                TaskEvent.TIME_OUT, error={"kind": "deadline", "message": "task deadline passed"}
            )
            return tx
        return None

    def _abandon_open_steps(self, tx: StepTxn) -> None:
        err = {"kind": "abandoned", "message": "the task ended before this step finished"}
        for s in sorted(tx.task.steps.values(), key=lambda s: s.index):
            if s.status == StepStatus.RUNNING:
                tx.finish_attempt(s, "LOST", error=err)
            if s.status in (StepStatus.PENDING, StepStatus.RUNNING, StepStatus.RETRY_WAIT):
                tx.step_transition(s, StepEvent.ABANDON, error=err)

    def _advance(self, tx: StepTxn, step: StepView | None) -> None:
        """Start the next attempt: of `step` if given (PENDING/RETRY_WAIT), else a new model turn."""
        task = tx.task
        if task.status == TaskStatus.WAITING:
            tx.task_transition(TaskEvent.RESUME)
        if task.status == TaskStatus.READY:
            tx.task_transition(TaskEvent.START)
        if step is not None:
            tx.start_attempt(step)
        elif task.step_count >= task.max_steps:
            tx.task_transition(TaskEvent.FAIL, error=_budget_error("max_steps", task.max_steps))
        else:
            tx.add_step(
                StepView(index=task.next_step_index, kind="model", status=StepStatus.PENDING), start=True
            )

    # -- executing an attempt ----------------------------------------------------------------
    def _execute(self, task: TaskView, step: StepView) -> None:
        in_doubt = (step.index, step.attempt_count) not in task.fresh_attempts
        attrs = {
            "dayzero.task_id": task.id,
            "dayzero.step": step.index,
            "dayzero.attempt": step.attempt_count,
            "dayzero.resumed": in_doubt,
        }
        if step.tool_name:
            attrs["dayzero.tool"] = step.tool_name
        if in_doubt:
            ATTEMPTS_RESUMED.inc()
        t0 = time.perf_counter()
        with task_span(task.traceparent, f"step.{step.kind}", attrs) as span:
            if step.kind == "model":
                self._execute_model(task, step)
            else:
                self._execute_tool(task, step, in_doubt=in_doubt)
            outcome = step.status.lower()  # succeeded, failed or retry_wait, as committed
            span.set_attribute("dayzero.outcome", outcome)
        STEP_SECONDS.labels(step.kind, outcome).observe(time.perf_counter() - t0)

    def _execute_model(self, task: TaskView, step: StepView) -> None:
        tools = self.tools.openai_tools(task.allowed_tools)
        try:
            messages = task.transcript
            if task.attachments:
                by_reference = bool(getattr(self.inference, "images_by_reference", False))
                messages = resolve_images(
                    messages, task.attachments, self.config.blob_url, by_reference=by_reference
                )
            turn = self.inference.chat(messages, tools, Sampling.from_mapping(task.sampling))
            error: InferenceError | None = None
        except InferenceError as exc:
            turn, error = None, exc
        except AttachmentError as exc:  # the same transcript can never resolve: permanent
            turn, error = None, InferenceError(str(exc), retryable=False)
        tx = self._txn(task)
        if error is not None or turn is None:
            trace_error(trace.get_current_span(), "InferenceError", str(error))
            policy = self.config.model_retry
            err = {"kind": "inference", "message": str(error), "retryable": bool(error and error.retryable)}
            tx.finish_attempt(step, "FAILED", error=err)
            kind = ErrorKind.RETRYABLE if err["retryable"] else ErrorKind.PERMANENT
            decision = decide(policy, kind, step.attempt_count)  # a model call has no side effect
            if decision.retry:
                self._schedule_retry(tx, step, decision, err)
            else:
                tx.step_transition(step, StepEvent.FAIL, error=err)
                tx.event("step.failed", {"step": step.index, "kind": "model", "error": err})
                tx.task_transition(TaskEvent.FAIL, error=err)
            tx.commit(self._conn)
            return
        usage = turn.usage
        MODEL_TOKENS.labels("prompt").inc(usage.prompt_tokens)
        MODEL_TOKENS.labels("cached").inc(usage.cached_tokens)
        MODEL_TOKENS.labels("completion").inc(usage.completion_tokens)
        if usage.ttft_ms is not None:
            MODEL_TTFT.observe(usage.ttft_ms / 1000)
        tx.finish_attempt(step, "SUCCEEDED", usage=usage.to_dict())
        tx.step_transition(step, StepEvent.SUCCEED)
        task.step_count += 1
        task.prompt_tokens += usage.prompt_tokens
        task.cached_tokens += usage.cached_tokens
        task.completion_tokens += usage.completion_tokens
        tx.append_transcript([turn.message()], step.index)
        # Usage is kept on the attempt row; the event carries the token total only.
        tokens = usage.prompt_tokens + usage.completion_tokens
        tx.event(
            "step.succeeded",
            {"step": step.index, "kind": "model", "calls": len(turn.tool_calls), "tokens": tokens},
        )
        if not turn.tool_calls:
            tx.task_transition(TaskEvent.SUCCEED, result=turn.content or "")
        elif task.total_tokens >= task.max_tokens:
            tx.task_transition(TaskEvent.FAIL, error=_budget_error("max_tokens", task.max_tokens))
        elif task.step_count >= task.max_steps:
            tx.task_transition(TaskEvent.FAIL, error=_budget_error("max_steps", task.max_steps))
        elif not (task.cancel_requested or tx.now >= task.deadline_at):
            for i, call in enumerate(turn.tool_calls):
                tool_step = StepView(
                    index=task.next_step_index,
                    kind="tool",
                    status=StepStatus.PENDING,
                    tool_name=call.name,
                    tool_call_id=call.id,
                    arguments=call.arguments,
                )
                tx.add_step(tool_step, start=i == 0)
        tx.commit(self._conn)

    def _tool_spec(self, name: str | None) -> ToolSpec | None:
        try:
            return self.tools.spec(name or "")
        except ToolError:
            return None

    def _tool_payload(self, task: TaskView, step: StepView, timeout_s: float) -> dict[str, Any]:
        workspace = str(Path(self.config.workspace_dir) / task.id) if self.config.workspace_dir else None
        return {
            "tool": step.tool_name or "",
            "arguments": step.arguments or "",
            "task_id": task.id,
            "step_index": step.index,
            "attempt": step.attempt_count,
            "idempotency_key": f"{task.id}:{step.index}:{step.attempt_count}",
            "workspace": workspace,
            "attachments": task.attachments,
            "timeout_s": timeout_s,
            "traceparent": current_traceparent() or task.traceparent,
            # The late-duplicate check of a redelivered job (workers.fence): who sent it, and
            # when nobody waits for it any more.
            "runner_id": self.config.runner_id,
            "not_after": job_not_after(timeout_s),
        }

    def _execute_tool(self, task: TaskView, step: StepView, *, in_doubt: bool) -> None:
        spec = self._tool_spec(step.tool_name)
        if task.allowed_tools is not None and step.tool_name not in task.allowed_tools:
            # The model was offered only the allowed tools, but it may name any: the task's
            # allow-list is enforced here, at execution. The refusal is the tool's (permanent)
            # error: recorded on the attempt and read by the model like any other tool result.
            outcome: dict[str, Any] = {
                "ok": False,
                "error": {
                    "error": f"tool {step.tool_name!r} is not allowed for this task "
                    f"(allowed: {', '.join(task.allowed_tools) or 'none'})",
                    "kind": ErrorKind.PERMANENT.value,
                    "code": "tool_not_allowed",
                },
            }
            lost = False
        elif in_doubt and spec is not None and not (spec.idempotent or spec.accepts_idempotency_key):
            outcome = {
                "ok": False,
                "error": {
                    "error": f"the outcome of {step.tool_name!r} is unknown: the runner executing it stopped, "
                    "and the tool is not safe to run twice",
                    "kind": ErrorKind.PERMANENT.value,
                },
            }
            lost = True
        else:
            policy = spec.retry if spec is not None else RetryPolicy()
            remaining = (task.deadline_at - utcnow()).total_seconds()
            timeout_s = max(0.001, min(policy.timeout_s, remaining))
            failpoint("before_tool")
            outcome = self.dispatcher.run_tool(self._tool_payload(task, step, timeout_s))
            failpoint("after_tool")
            lost = False
        tx = self._txn(task)
        self._record_tool_outcome(tx, step, spec, outcome, lost=lost)
        tx.commit(self._conn)

    def _record_tool_outcome(
        self, tx: StepTxn, step: StepView, spec: ToolSpec | None, outcome: dict[str, Any], *, lost: bool
    ) -> None:
        task = tx.task
        span = trace.get_current_span()
        if outcome.get("ok"):
            TOOL_ATTEMPTS.labels(step.tool_name or "", "ok").inc()
            span.set_attribute("dayzero.tool.outcome", "ok")
            content = outcome.get("content")
            tx.finish_attempt(step, "SUCCEEDED")
            tx.step_transition(step, StepEvent.SUCCEED)
            tx.event("step.succeeded", {"step": step.index, "kind": "tool", "tool": step.tool_name})
        else:
            err = dict(outcome.get("error") or {"error": "tool failed", "kind": ErrorKind.PERMANENT.value})
            kind = err.get("kind")
            TOOL_ATTEMPTS.labels(step.tool_name or "", "lost" if lost else str(kind)).inc()
            span.set_attribute("dayzero.tool.outcome", "lost" if lost else str(kind))
            trace_error(span, str(err.get("type") or kind), str(err.get("error") or err.get("message")))
            tx.finish_attempt(step, "LOST" if lost else "FAILED", error=err)
            decision = Decision(retry=False)  # an unknown tool: nothing to retry
            if spec is not None:
                decision = decide_tool(spec, ToolError.from_dict(err), step.attempt_count)
            if decision.retry:
                self._schedule_retry(tx, step, decision, err)
                return
            tx.step_transition(step, StepEvent.FAIL, error=err)
            tx.event(
                "step.failed", {"step": step.index, "kind": "tool", "tool": step.tool_name, "error": err}
            )
            if spec is not None and spec.retry.fail_task_on_exhaustion and decision.exhausted:
                tx.task_transition(TaskEvent.FAIL, error={"kind": "tool", "tool": step.tool_name, **err})
                return
            content = err  # the model reads the error as the tool's result
        task.step_count += 1
        text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
        tx.append_transcript(
            [{"role": "tool", "tool_call_id": step.tool_call_id, "content": text}], step.index
        )
        if task.cancel_requested or tx.now >= task.deadline_at:
            return  # the next loop turn ends the task at this boundary
        nxt = task.open_step()
        if task.step_count >= task.max_steps:
            self._abandon_open_steps(tx)
            tx.task_transition(TaskEvent.FAIL, error=_budget_error("max_steps", task.max_steps))
        elif nxt is not None:
            tx.start_attempt(nxt)
        else:
            tx.add_step(
                StepView(index=task.next_step_index, kind="model", status=StepStatus.PENDING), start=True
            )

    def _schedule_retry(self, tx: StepTxn, step: StepView, decision: Decision, err: dict[str, Any]) -> None:
        delay, cap = decision.delay_s, decision.cap_s
        due = tx.now + dt.timedelta(seconds=delay)
        tx.step_transition(step, StepEvent.RETRY, next_attempt_at=due)
        STEP_RETRIES.labels(step.kind).inc()
        trace.get_current_span().set_attribute("dayzero.retry_delay_s", delay)
        tx.event(
            "step.retry_scheduled",
            {"step": step.index, "attempt": step.attempt_count, "delay_s": delay, "cap_s": cap, "error": err},
        )


def _tool_path(blob_url: str, sha256: str, redaction: dict[str, Any] | None) -> str | None:
    """The file tools may read for an attachment: with redaction on, the redacted image only."""
    if redaction and redaction.get("enabled"):
        redacted = redaction.get("image_sha256")
        return local_blob_path(blob_url, redacted) if redacted else None
    return local_blob_path(blob_url, sha256)


def _budget_error(which: str, limit: int) -> dict[str, Any]:
    return {
        "kind": "budget_exhausted",
        "budget": which,
        "limit": limit,
        "message": f"{which} budget of {limit} used up",
    }

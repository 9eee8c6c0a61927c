"""The runner loop: claim a task, then execute its steps one transaction each.

Crash safety. The transaction that finishes step k also starts step k+1 (the task row records
it RUNNING, at its attempt number, before anything executes). A runner killed at any instant leaves either the
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
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine

from core.backoff import Backoff
from core.outage import Stopped, wait_out
from orchestrator.attachments import blob_store, local_blob_path
from orchestrator.clock import utcnow
from orchestrator.dispatch import Dispatcher
from orchestrator.inference_client import InferenceClient
from orchestrator.metrics import ATTEMPTS_RESUMED, LEASES_LOST, STEP_SECONDS
from orchestrator.probes import Health
from orchestrator.runner import tasklog, workspaces
from orchestrator.runner.boundary import abandon_open_steps, budget_error
from orchestrator.runner.cancel import CancelSignal, CancelWatch
from orchestrator.runner.context import RunnerConfig
from orchestrator.runner.heartbeat import Heartbeat
from orchestrator.runner.lease import LeaseLost, claim_with_state
from orchestrator.runner.model_step import run_model_step
from orchestrator.runner.payloads import PayloadCache, reference, referenced_sha, resumed_context_state
from orchestrator.runner.preprocess_step import run_preprocess
from orchestrator.runner.tool_step import run_tool_step
from orchestrator.runner.transcripts import CachedTranscript, TranscriptCache
from orchestrator.runner.txn import StepTxn, StepView, TaskView
from orchestrator.statemachine import TERMINAL_TASK_STATUSES, StepStatus, TaskEvent, TaskStatus
from orchestrator.tasks.errors import StaleTransition
from orchestrator.tasks.queries import TaskState, has_unfinished_tasks, task_state
from orchestrator.tracing import task_span
from tools.registry import ToolRegistry

log = logging.getLogger(__name__)

_TERMINAL = TERMINAL_TASK_STATUSES


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
        self.conn: Connection | None = None  # the connection driving the current task
        self._held: Connection | None = None  # kept between `run_once` calls (`_connection`)
        self._heartbeat = Heartbeat(engine, self.config.runner_id, self.config.lease_s, self.health)
        self._cancel_watch = CancelWatch(engine)
        self.cancel_signal: CancelSignal | None = None  # of the step in flight (`runner.cancel`)
        # each task's transcript between claims: a claim reads only the rows written since
        self.transcripts = TranscriptCache(self.config.transcript_cache_tasks)
        self._payloads: PayloadCache | None = None  # big tool results, read once per process
        self._next_sweep = float("-inf")  # of ended tasks' workspaces (`_sweep_workspaces`)

    # -- outer loop --------------------------------------------------------------------------
    @property
    def stopping(self) -> threading.Event:
        """Set once `stop()` was called: waits inside a step end on it."""
        return self._stop

    def stop(self) -> None:
        self._stop.set()
        self._heartbeat.close()
        self._cancel_watch.close()

    def run_forever(self) -> None:
        """Loop until `stop()`. An outage (the database, a broker) is waited out with backoff
        (`core.outage`): the lease of whatever was in flight expires and the work resumes from
        the last commit. `health` (the probes) follows: unready while a dependency is away. Any
        other error is a bug and ends the process."""
        backoff = Backoff()
        try:
            while not self._stop.is_set():
                try:
                    worked = wait_out(
                        "runner", self.run_once, stop=self._stop, readiness=self.health, backoff=backoff
                    )
                except Stopped:
                    break
                if not worked:
                    self._stop.wait(self.config.poll_interval_s)
        finally:
            self._release_connection()

    def run_until_idle(self, *, timeout_s: float = 60.0, until: Callable[[], bool] | None = None) -> None:
        """Work until no task is runnable (or `until()` holds); tasks in backoff are waited for."""
        end = time.monotonic() + timeout_s
        try:
            while time.monotonic() < end:
                if until is not None and until():
                    return
                if self.run_once():
                    continue
                if until is None and not self._has_unfinished_tasks():
                    return
                time.sleep(self.config.poll_interval_s)
        finally:
            self._release_connection()
        raise TimeoutError(f"runner did not go idle within {timeout_s} s")

    def _has_unfinished_tasks(self) -> bool:
        with self.engine.connect() as conn:
            return has_unfinished_tasks(conn)

    def run_once(self) -> bool:
        """Claim one task and drive it as far as it goes; False when nothing was claimable.

        The claim and the reads of the task's state share one transaction (`claim_with_state`:
        one round trip on PostgreSQL) and one connection, which then drives the task. The
        connection is kept from one call to the next (checking one out of the pool pings the
        server: a round trip per task); after any error it is given back, and the next call
        takes a fresh one."""
        self._sweep_workspaces()
        conn = self._connection()
        try:
            state = claim_with_state(conn, self.config.runner_id, self.config.lease_s, self.transcripts)
            if state is None:
                return False
            task = self._view(state)
            tasklog.claimed(task, self.config.runner_id)
            try:
                self._drive(conn, task)
                self._keep_transcript(task)
            except (LeaseLost, StaleTransition) as exc:
                if isinstance(exc, LeaseLost):
                    LEASES_LOST.inc()
                log.info("gave up task %s: %s", state.task.id, exc)
            finally:
                tasklog.left(task, self.config.runner_id, stopping=self._stop.is_set())
        except BaseException:
            self._release_connection()  # it may be broken or inside a failed transaction
            raise
        return True

    def _sweep_workspaces(self) -> None:
        """Every `workspace_sweep_s`: delete workspaces whose tasks ended (`runner.workspaces`)."""
        now = time.monotonic()
        if not self.config.workspace_dir or now < self._next_sweep:
            return
        self._next_sweep = now + self.config.workspace_sweep_s
        with self.engine.connect() as conn:
            workspaces.sweep(conn, self.config.workspace_dir, self.config.workspace_retention_s)

    @property
    def payloads(self) -> PayloadCache:
        if self._payloads is None:
            self._payloads = PayloadCache(blob_store(self.config.blob_url))
        return self._payloads

    def offload_payload(self, text: str) -> Any:
        """What a history row stores for a tool result's text: the text, or a blob reference."""
        limit = self.config.payload_ref_bytes
        if limit is None or len(text) <= limit:
            return text
        return reference(self.payloads.put(text), len(text.encode()))

    def _keep_transcript(self, task: TaskView) -> None:
        """After a drive that ended without error (everything in memory is committed): keep the
        transcript of a task that will run again, for its next claim."""
        if task.status in _TERMINAL:
            return
        self.transcripts.put(
            task.id,
            CachedTranscript(
                created_at=task.created_at,
                position=task.event_seq,
                goal_messages=task.goal_messages,
                messages=task.transcript,
                steps=task.message_steps,
                resolved=task.resolved_messages or None,
            ),
        )

    def _connection(self) -> Connection:
        if self._held is None:
            self._held = self.engine.connect()
        return self._held

    def _release_connection(self) -> None:
        held, self._held = self._held, None
        if held is not None:
            held.close()

    # -- one task ----------------------------------------------------------------------------
    def _load(self, task_id: str) -> TaskView:
        with self.engine.connect() as conn:
            return self._view(task_state(conn, task_id))

    def _view(self, state: TaskState) -> TaskView:
        t, rows, transcript = state.task, state.steps, state.messages
        # history rows that refer to a stored tool result: the text, once per process (the
        # transcript kept between claims has them resolved already)
        if any(referenced_sha(m.get("content")) for m in transcript):
            self.payloads.resolve(transcript)
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
        # The open steps (derived from the task row and the transcript: `tasks.history`).
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
        }
        stored = getattr(t, "context_state", None)
        trimmed, known = resumed_context_state(stored)
        return TaskView(
            id=t.id,
            tenant=t.tenant,
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
            next_step_index=t.next_step,
            traceparent=t.traceparent,
            attachments=atts,
            cancel_requested=t.cancel_requested,
            message_steps=state.message_steps,
            goal_messages=state.goal_messages,
            event_seq=t.event_seq,
            created_at=getattr(t, "created_at", None),
            resolved_messages=self.transcripts.take_resolved(t.id, transcript),
            max_context_tokens=getattr(t, "max_context_tokens", None),
            context_policy=getattr(t, "context_policy", None),
            context_trimmed=trimmed,
            last_prompt=known,
            context_stored=stored,
        )

    def _drive(self, conn: Connection, task: TaskView) -> None:
        # One connection for the whole drive: checked out (and pinged) once, not once per step.
        self.conn = conn
        with self._heartbeat.hold(task.id):
            while not self._stop.is_set() and task.status not in _TERMINAL:
                step = task.open_step()
                if task.cancel_requested or utcnow() >= task.deadline_at:
                    self._commit(self._end_if_asked(self.txn(task)))
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
                tx = self.txn(task)
                self._advance(tx, step)
                tx.commit(self.conn, wait_for_flush=not self._starts_model_attempt(tx, step))
        if task.status in _TERMINAL:
            workspaces.task_ended(
                self.config.workspace_dir, self.config.workspace_retention_s, task.tenant, task.id
            )

    def _preprocess(self, task: TaskView) -> bool:
        return run_preprocess(self, task)

    def txn(self, task: TaskView) -> StepTxn:
        return StepTxn(task, self.config.runner_id, self.config.lease_s)

    def _commit(self, tx: StepTxn | None) -> None:
        if tx is not None:
            tx.commit(self.conn)

    def _park(self, task: TaskView, until: dt.datetime) -> None:
        """Release the task until its next retry is due (RUNNING → WAITING)."""
        tx = self.txn(task)
        tx.task_transition(TaskEvent.WAIT, _payload={"until": until.isoformat()})
        tx.set_task(next_run_at=until, lease_owner=None, lease_until=None)
        tx.commit(self.conn)

    def _end_if_asked(self, tx: StepTxn) -> StepTxn | None:
        """At a step boundary: honour cancellation and the deadline. Returns `tx` if the task ended."""
        task = tx.task
        if task.cancel_requested:
            abandon_open_steps(tx)
            tx.task_transition(
                TaskEvent.CANCEL, error={"kind": "cancelled", "message": "cancelled by request"}
            )
            return tx
        if tx.now >= task.deadline_at:
            abandon_open_steps(tx)
            tx.task_transition(
                TaskEvent.TIME_OUT, error={"kind": "deadline", "message": "task deadline passed"}
            )
            return tx
        return None

    @staticmethod
    def _starts_model_attempt(tx: StepTxn, step: StepView | None) -> bool:
        """Whether `_advance` only started a model attempt (after the task's start, resume or a
        retry wait). Such a transaction's commit need not wait for its WAL flush: a model call
        acts on nothing outside the database, and the attempt's own commit, durable, flushes the
        start with it; a server crash in between loses a start that nothing saw happen but
        the events feed, and the task is claimed again from where it was. A tool attempt's
        start must be on disk before the tool runs (its idempotency key, the in-doubt rule)."""
        started = tx.task.open_step()
        return (
            tx.task.status == TaskStatus.RUNNING
            and started is not None
            and started.kind == "model"
            and started.status == StepStatus.RUNNING
            and (step is None or step is started)
        )

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
            tx.task_transition(TaskEvent.FAIL, error=budget_error("max_steps", task.max_steps))
        else:
            tx.add_step(
                StepView(index=task.next_step_index, kind="model", status=StepStatus.PENDING), start=True
            )

    # -- executing an attempt ----------------------------------------------------------------
    # The step kinds, as methods so that tests can stand in for one of them.
    def _execute_model(self, task: TaskView, step: StepView) -> None:
        run_model_step(self, task, step)

    def _execute_tool(self, task: TaskView, step: StepView, *, in_doubt: bool) -> None:
        run_tool_step(self, task, step, in_doubt=in_doubt)

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
        with (
            task_span(task.traceparent, f"step.{step.kind}", attrs) as span,
            self._cancel_watch.watch(task.id) as sig,
        ):
            self.cancel_signal = sig
            try:
                if step.kind == "model":
                    self._execute_model(task, step)
                else:
                    self._execute_tool(task, step, in_doubt=in_doubt)
            finally:
                self.cancel_signal = None
            if sig.event.is_set():
                task.cancel_requested = True  # the step wrote nothing: the next turn cancels the task
            outcome = step.status.lower()  # succeeded, failed or retry_wait, as committed
            span.set_attribute("dayzero.outcome", outcome)
        seconds = time.perf_counter() - t0
        STEP_SECONDS.labels(step.kind, outcome).observe(seconds)
        tasklog.step_done(task, step, outcome, seconds)


def _tool_path(blob_url: str, sha256: str, redaction: dict[str, Any] | None) -> str | None:
    """The file tools may read for an attachment: with redaction on, the redacted image only."""
    if redaction and redaction.get("enabled"):
        redacted = redaction.get("image_sha256")
        return local_blob_path(blob_url, redacted) if redacted else None
    return local_blob_path(blob_url, sha256)

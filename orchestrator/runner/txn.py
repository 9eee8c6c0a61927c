"""One step's transaction: decided in memory, then written at once, fenced on the lease.

The runner holds the task's lease, so its in-memory `TaskView` is the truth while it works; a
`StepTxn` records the writes a step needs and `commit()` sends them through the one transaction
writer (`tasks.writer.TaskWrite.commit`, fenced on the lease): on PostgreSQL ONE statement that
is its own transaction (one round trip); on SQLite the same statements inside `BEGIN IMMEDIATE`.
If the lease is gone, or a row was not in the expected state, the whole transaction rolls back
(`LeaseLost` / `StaleTransition`). The task row is written once per transaction; it returns
`cancel_requested`, which the runner honours at the next step boundary (a step in flight is
interrupted sooner: `runner.cancel`).

Steps have no rows of their own (migration 0011, `tasks.history`): the task row carries the open
step (`open_*`, `next_step`, written from the view at every commit), and a finished step's
outcome and the message it appended ride on the history row of the event that finishes it
(`step.succeeded` / `step.failed`). Only the lease holder writes a task's steps, so the lease
fence is what keeps them consistent.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Table

from orchestrator.clock import utcnow
from orchestrator.db.tables import attempts_t
from orchestrator.failpoints import failpoint
from orchestrator.metrics import TASKS_FINISHED
from orchestrator.runner.lease import LeaseLost
from orchestrator.runner.payloads import stored_context_state
from orchestrator.statemachine import (
    TERMINAL_TASK_STATUSES,
    StepEvent,
    StepStatus,
    TaskEvent,
    TaskTransition,
    next_step_status,
)
from orchestrator.tasks.errors import StaleTransition
from orchestrator.tasks.writer import TaskWrite, lease_fence
from orchestrator.tracing import record_transition


@dataclass
class StepView:
    """What the runner keeps in memory about a step of the task it holds."""

    index: int
    kind: str  # "model" | "tool"
    status: str
    tool_name: str | None = None
    tool_call_id: str | None = None
    arguments: str | None = None
    attempt_count: int = 0
    next_attempt_at: dt.datetime | None = None
    started_at: dt.datetime | None = None
    runner_id: str | None = None  # who started the current attempt


@dataclass
class TaskView:
    """The runner's in-memory view of the task it holds, rebuilt from the DB at each claim."""

    id: str
    status: str
    allowed_tools: list[str] | None
    sampling: dict[str, Any] | None
    max_steps: int
    max_tokens: int
    deadline_at: dt.datetime
    step_count: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    transcript: list[dict[str, Any]]
    steps: dict[int, StepView]  # the open steps at the claim, and every step started since
    next_step_index: int
    traceparent: str | None = None
    tenant: str = ""
    attachments: list[dict[str, Any]] = field(default_factory=list)
    cancel_requested: bool = False
    # The OpenAI `tools` list offered to the model, built once per claim (by the model step).
    offered_tools: list[dict[str, Any]] | None = None
    # Attempts this runner started itself and has not executed yet: not in doubt.
    fresh_attempts: set[tuple[int, int]] = field(default_factory=set)
    # step index -> what was wrong with its last model output, shown to the model on the retry
    # (read back from the failed attempt when another runner retries it).
    model_feedback: dict[int, str] = field(default_factory=dict)
    # What the runner's transcript cache needs (`runner.transcripts`): each message's step
    # index (None: the goal's), the goal's message count, the task's `event_seq` after this
    # runner's last commit, and the row's creation time (which task the id named).
    message_steps: list[int | None] = field(default_factory=list)
    goal_messages: int = 0
    event_seq: int = 0
    created_at: dt.datetime | None = None
    # The context policy (`runner.payloads`): the budget's cap and policy, the trim boundary and
    # its notices, and (message count, prompt tokens) of the last model turn sent.
    max_context_tokens: int | None = None
    context_policy: str | None = None
    context_trimmed: int = 0
    context_notices: dict[int, dict[str, Any]] = field(default_factory=dict)
    last_prompt: tuple[int, int] | None = None
    # the row's `context_state` as last read or written (written again only when it changes)
    context_stored: dict[str, Any] | None = None
    # the transcript with its attachments resolved for the model (`resolve_images`), as far as
    # it has been sent
    resolved_messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def open_step(self) -> StepView | None:
        """The lowest-index step that is not finished (steps run strictly in order)."""
        open_steps = [
            s for s in self.steps.values() if s.status not in (StepStatus.SUCCEEDED, StepStatus.FAILED)
        ]
        return min(open_steps, key=lambda s: s.index) if open_steps else None


class StepTxn:
    """Collects one step's writes; `commit(conn)` applies them atomically or not at all."""

    def __init__(self, task: TaskView, runner_id: str, lease_s: float):
        self.task = task
        self.runner_id = runner_id
        self.lease_s = lease_s
        self._w = TaskWrite(task.id, lease_fence(runner_id), utcnow())
        self.now = self._w.now
        self._events = self._w.events
        self._task_values: dict[str, Any] = {}
        # step index -> the history-row columns of its outcome and of the message it appended
        self._finished: dict[int, dict[str, Any]] = {}
        self._abandoned: list[StepView] = []
        # (entity, from, to, step index or None): traced once the commit succeeded
        self._transitions: list[tuple[str, str, str, int | None]] = []

    # -- events and the task row -------------------------------------------------------------
    def event(self, typ: str, payload: dict[str, Any]) -> None:
        self._events.append((typ, payload))

    def task_transition(self, event: TaskEvent, **values: Any) -> None:
        t = TaskTransition(self.task.status, event, self.now, values.pop("_payload", {}))
        self._transitions.append(("task", t.old, t.new.value, None))
        self.event(t.event_type, t.event_payload)
        self._task_values.update(values, **t.row)
        self.task.status = t.new.value

    def set_task(self, **values: Any) -> None:
        self._task_values.update(values)

    def update_row(self, table: Table, where: Mapping[str, Any], **values: Any) -> None:
        """An UPDATE of one row (keyed by `where`) that must hit exactly that row."""
        self._w.update_row(table, where, **values)

    # -- steps, attempts, messages -----------------------------------------------------------
    def add_step(self, step: StepView, *, start: bool = False) -> None:
        """A new step (recorded on the task row at commit); with `start`, directly RUNNING with
        attempt 1."""
        if start:
            new = next_step_status(step.status, StepEvent.START).value
            self._transitions.append(("step", step.status, new, step.index))
            step.status = new
            self._mark_started(step)
            self._started_event(step)
        self.task.steps[step.index] = step
        self.task.next_step_index = max(self.task.next_step_index, step.index + 1)

    def step_transition(self, step: StepView, event: StepEvent, **values: Any) -> None:
        new = next_step_status(step.status, event)
        self._transitions.append(("step", step.status, new.value, step.index))
        step.status = new.value
        for k in ("attempt_count", "next_attempt_at", "started_at", "runner_id"):
            if k in values:
                setattr(step, k, values[k])
        if event == StepEvent.ABANDON:
            self._abandoned.append(step)  # the task ends with it: recorded on the task row
        elif new in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            self._finished.setdefault(step.index, {}).update(
                step_index=step.index,
                step_status=new.value,
                attempt=step.attempt_count,
                runner_id=step.runner_id,
                resumed=values.get("resumed", 0),
                started_at=step.started_at,
                usage=values.get("usage"),
                error=values.get("error"),
            )

    def _started_event(self, step: StepView) -> None:
        """One event per state change, but a step that finishes and the next one that starts in the
        same transaction share a row: the start rides on the finish event as `next`."""
        started: dict[str, Any] = {"step": step.index, "attempt": step.attempt_count}
        if step.tool_name:
            started["tool"] = step.tool_name
        if self._events and self._events[-1][0] in ("step.succeeded", "step.failed"):
            self._events[-1][1]["next"] = started
        else:
            self.event("step.started", {**started, "kind": step.kind})

    def _mark_started(self, step: StepView) -> None:
        step.attempt_count += 1
        step.started_at = self.now
        step.runner_id = self.runner_id
        step.next_attempt_at = None
        self.task.fresh_attempts.add((step.index, step.attempt_count))

    def start_attempt(self, step: StepView) -> int:
        """PENDING/RETRY_WAIT → RUNNING as attempt n+1; returns n+1."""
        attempt = step.attempt_count + 1
        self.step_transition(
            step,
            StepEvent.START,
            attempt_count=attempt,
            next_attempt_at=None,
            started_at=self.now,
            runner_id=self.runner_id,
        )
        self.task.fresh_attempts.add((step.index, attempt))
        self._started_event(step)
        return attempt

    def _resumed(self, step: StepView) -> int:
        """1 when this runner did not start the step's current attempt itself: it took the attempt
        over after the runner that started it died, under the same idempotency key."""
        return 0 if (step.index, step.attempt_count) in self.task.fresh_attempts else 1

    def succeed_step(self, step: StepView, *, usage: Mapping[str, Any] | None = None) -> None:
        """RUNNING → SUCCEEDED. The successful attempt is recorded on the step row itself, in the
        same UPDATE (no attempt row of its own: one row write less per step). Without usage (a
        tool) `usage` stays SQL NULL, which reads as None as JSON `null` would, in fewer bytes."""
        extra = {} if usage is None else {"usage": usage}
        self.step_transition(
            step,
            StepEvent.SUCCEED,
            runner_id=self.runner_id,
            resumed=self._resumed(step),
            started_at=step.started_at or self.now,
            **extra,
        )
        self.task.fresh_attempts.discard((step.index, step.attempt_count))

    def finish_attempt(
        self,
        step: StepView,
        status: str,
        *,
        error: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
    ) -> None:
        """Record a failed or lost attempt of the step (the attempt table is append-only); a
        successful one is recorded by `succeed_step`."""
        if status == "SUCCEEDED":
            raise ValueError("a successful attempt is recorded by succeed_step, on the step row")
        row = {
            "task_id": self.task.id,
            "step_index": step.index,
            "attempt": step.attempt_count,
            "status": status,
            "runner_id": self.runner_id,
            "resumed": self._resumed(step),
            "error": error,
            "usage": usage,
            "started_at": step.started_at or self.now,
            "finished_at": self.now,
        }
        self._w.insert(attempts_t, row)
        self.task.fresh_attempts.discard((step.index, step.attempt_count))

    def append_message(self, m: dict[str, Any], step_index: int, *, stored_content: Any = None) -> None:
        """The message a finishing step appends (one per step: it rides on the step's history row).
        `stored_content`: what the row holds instead of the content (a blob reference)."""
        self._finished.setdefault(step_index, {}).update(
            role=m["role"],
            content=m.get("content") if stored_content is None else stored_content,
            tool_calls=m.get("tool_calls"),
            tool_call_id=m.get("tool_call_id"),
        )
        self.task.transcript.append(m)
        self.task.message_steps.append(step_index)

    def _attach_finished(self) -> None:
        """Put each finished step's outcome and message on the history row of its finish event."""
        for index, columns in self._finished.items():
            for j, (typ, payload) in enumerate(self._events):
                if typ in ("step.succeeded", "step.failed") and payload.get("step") == index:
                    self._w.attach(j, columns)
                    break
            else:
                raise AssertionError(f"step {index} finished without its step.succeeded/failed event")

    def _open_step_values(self) -> dict[str, Any]:
        """The task row's open-step columns, from the view (abandoned steps: the first of them)."""
        t = self.task
        step = min(self._abandoned, key=lambda s: s.index) if self._abandoned else t.open_step()
        if step is None:
            return {
                "open_step": None,
                "open_status": None,
                "open_attempt": 0,
                "open_started_at": None,
                "open_runner_id": None,
                "open_next_attempt_at": None,
                "next_step": t.next_step_index,
            }
        return {
            "open_started_at": step.started_at,
            "open_step": step.index,
            "next_step": t.next_step_index,
            "open_status": StepStatus.FAILED.value if self._abandoned else step.status,
            "open_attempt": step.attempt_count,
            "open_runner_id": step.runner_id,
            "open_next_attempt_at": step.next_attempt_at,
        }

    # -- commit ------------------------------------------------------------------------------
    def commit(self, conn: Connection, *, wait_for_flush: bool = True) -> None:
        """Apply every write in one transaction on `conn` (which must not be in a transaction).
        `wait_for_flush=False`: see `TaskWrite.commit` (the caller vouches that nothing outside
        the database acts on this transaction before the task's next durable commit).

        Raises `LeaseLost` when another runner holds the task now, `StaleTransition` when a row
        was not in the state this runner expected; either way nothing was written."""
        t = self.task
        task_values: dict[str, Any] = {
            "updated_at": self.now,
            "step_count": t.step_count,
            "prompt_tokens": t.prompt_tokens,
            "cached_tokens": t.cached_tokens,
            "completion_tokens": t.completion_tokens,
            "lease_until": self.now + dt.timedelta(seconds=self.lease_s),
            **self._open_step_values(),
            **self._task_values,
        }
        context = None
        if t.max_context_tokens is not None:
            context = stored_context_state(t.context_trimmed, t.last_prompt)
            if context != t.context_stored:
                task_values["context_state"] = context
        self._w.task_values = task_values
        self._attach_finished()
        outcome = self._w.commit(
            conn, before_commit=lambda: failpoint("before_commit"), wait_for_flush=wait_for_flush
        )
        if outcome is None:
            raise LeaseLost(t.id)
        if not outcome.all_hit:
            raise StaleTransition(f"task {t.id}: a row was not in its expected state")
        failpoint("after_commit")
        if context is not None:
            t.context_stored = context
        t.cancel_requested = outcome.cancel_requested
        t.event_seq = outcome.event_seq
        self._trace_transitions()

    def _trace_transitions(self) -> None:
        for entity, old, new, index in self._transitions:
            attrs = {} if index is None else {"dayzero.step": index}
            record_transition(entity, self.task.id, old, new, self.task.traceparent, **attrs)
            if entity == "task" and new in TERMINAL_TASK_STATUSES:
                TASKS_FINISHED.labels(new).inc()

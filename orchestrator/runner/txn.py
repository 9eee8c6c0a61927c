"""One step's transaction: fenced on the lease, every status change checked against the tables,
outbox events appended, the task row written once at the end.

Use as `with StepTxn.open(engine, task, runner_id, lease_s) as tx: …`; leaving the block commits.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, update

from orchestrator.clock import utcnow
from orchestrator.failpoints import failpoint
from orchestrator.runner.lease import lock_leased_task
from orchestrator.statemachine import (
    TERMINAL_TASK_STATUSES,
    StepEvent,
    StepStatus,
    TaskEvent,
    next_step_status,
    next_task_status,
)
from orchestrator.store import StaleTransition, append_events, append_messages, attempts_t, steps_t, tasks_t


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
    steps: dict[int, StepView]  # every step not yet finished, plus the last one
    next_step_index: int
    traceparent: str | None = None
    attachments: list[dict[str, Any]] = field(default_factory=list)
    # Attempts this runner started itself and has not executed yet: not in doubt.
    fresh_attempts: set[tuple[int, int]] = field(default_factory=set)

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
    def __init__(self, conn: Connection, task: TaskView, runner_id: str, lease_s: float):
        self.conn = conn
        self.task = task
        self.runner_id = runner_id
        self.lease_s = lease_s
        self.now = utcnow()
        self.cancel_requested, self._event_seq, db_status = lock_leased_task(conn, task.id, runner_id)
        task.status = db_status
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._task_values: dict[str, Any] = {}

    @classmethod
    @contextmanager
    def open(cls, engine: Engine, task: TaskView, runner_id: str, lease_s: float) -> Iterator[StepTxn]:
        with engine.begin() as conn:
            tx = cls(conn, task, runner_id, lease_s)
            yield tx
            tx._flush()
            failpoint("before_commit")
        failpoint("after_commit")

    # -- events and the task row -------------------------------------------------------------
    def event(self, typ: str, payload: dict[str, Any]) -> None:
        self._events.append((typ, payload))

    def task_transition(self, event: TaskEvent, **values: Any) -> None:
        new = next_task_status(self.task.status, event)
        self.event(
            "task." + new.value.lower(),
            {"from": self.task.status, "to": new.value, **values.pop("_payload", {})},
        )
        self._task_values.update(values)
        self._task_values["status"] = new.value
        if new in TERMINAL_TASK_STATUSES:
            self._task_values.update(finished_at=self.now)
        self.task.status = new.value

    def set_task(self, **values: Any) -> None:
        self._task_values.update(values)

    def _flush(self) -> None:
        t = self.task
        vals: dict[str, Any] = {
            "updated_at": self.now,
            "step_count": t.step_count,
            "prompt_tokens": t.prompt_tokens,
            "cached_tokens": t.cached_tokens,
            "completion_tokens": t.completion_tokens,
            "event_seq": self._event_seq + len(self._events),
            **self._task_values,
        }
        if t.status in TERMINAL_TASK_STATUSES:
            vals.update(lease_owner=None, lease_until=None)
        elif "lease_until" not in vals:
            vals["lease_until"] = self.now + dt.timedelta(seconds=self.lease_s)
        self.conn.execute(update(tasks_t).where(tasks_t.c.id == t.id).values(**vals))
        append_events(self.conn, t.id, self._event_seq + 1, self._events)

    # -- steps, attempts, messages -----------------------------------------------------------
    def add_step(self, step: StepView) -> None:
        self.conn.execute(
            insert(steps_t).values(
                task_id=self.task.id,
                step_index=step.index,
                kind=step.kind,
                status=step.status,
                tool_name=step.tool_name,
                tool_call_id=step.tool_call_id,
                arguments=step.arguments,
                attempt_count=0,
                created_at=self.now,
            )
        )
        self.task.steps[step.index] = step
        self.task.next_step_index = max(self.task.next_step_index, step.index + 1)

    def step_transition(self, step: StepView, event: StepEvent, **values: Any) -> None:
        new = next_step_status(step.status, event)
        if new in (StepStatus.SUCCEEDED, StepStatus.FAILED):
            values.setdefault("finished_at", self.now)
        res = self.conn.execute(
            update(steps_t)
            .where(
                steps_t.c.task_id == self.task.id,
                steps_t.c.step_index == step.index,
                steps_t.c.status == step.status,
            )
            .values(status=new.value, **values)
        )
        if res.rowcount != 1:
            raise StaleTransition(f"step {self.task.id}:{step.index} is no longer {step.status}")
        step.status = new.value
        for k in ("attempt_count", "next_attempt_at"):
            if k in values:
                setattr(step, k, values[k])

    def start_attempt(self, step: StepView) -> int:
        """PENDING/RETRY_WAIT → RUNNING with a new attempt row; returns the attempt number."""
        attempt = step.attempt_count + 1
        self.step_transition(step, StepEvent.START, attempt_count=attempt, next_attempt_at=None)
        self.conn.execute(
            insert(attempts_t).values(
                task_id=self.task.id,
                step_index=step.index,
                attempt=attempt,
                status="RUNNING",
                runner_id=self.runner_id,
                started_at=self.now,
            )
        )
        self.task.fresh_attempts.add((step.index, attempt))
        self.event(
            "step.started",
            {"step": step.index, "kind": step.kind, "attempt": attempt, "tool": step.tool_name},
        )
        return attempt

    def finish_attempt(
        self,
        step: StepView,
        status: str,
        *,
        error: Mapping[str, Any] | None = None,
        usage: Mapping[str, Any] | None = None,
        resumed: bool = False,
    ) -> None:
        values: dict[str, Any] = {"status": status, "finished_at": self.now, "error": error, "usage": usage}
        if resumed:
            values.update(resumed=attempts_t.c.resumed + 1, runner_id=self.runner_id)
        res = self.conn.execute(
            update(attempts_t)
            .where(
                attempts_t.c.task_id == self.task.id,
                attempts_t.c.step_index == step.index,
                attempts_t.c.attempt == step.attempt_count,
                attempts_t.c.status == "RUNNING",
            )
            .values(**values)
        )
        if res.rowcount != 1:
            raise StaleTransition(f"attempt {self.task.id}:{step.index}:{step.attempt_count} is not RUNNING")
        self.task.fresh_attempts.discard((step.index, step.attempt_count))

    def append_transcript(self, messages: Sequence[dict[str, Any]], step_index: int) -> None:
        append_messages(self.conn, self.task.id, len(self.task.transcript), messages, step_index=step_index)
        self.task.transcript.extend(messages)

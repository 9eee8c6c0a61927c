"""Decisions at a step boundary that every step kind makes the same way: a retry scheduled, a
budget used up, the open steps abandoned when the task ends."""

from __future__ import annotations

import datetime as dt
from typing import Any

from opentelemetry import trace

from orchestrator.metrics import STEP_RETRIES
from orchestrator.retry import Decision
from orchestrator.runner.txn import StepTxn, StepView
from orchestrator.statemachine import StepEvent, StepStatus
from orchestrator.tasks.history import ABANDONED


def schedule_retry(tx: StepTxn, step: StepView, decision: Decision, err: dict[str, Any]) -> None:
    delay, cap = decision.delay_s, decision.cap_s
    due = tx.now + dt.timedelta(seconds=delay)
    tx.step_transition(step, StepEvent.RETRY, next_attempt_at=due)
    STEP_RETRIES.labels(step.kind).inc()
    trace.get_current_span().set_attribute("dayzero.retry_delay_s", delay)
    tx.event(
        "step.retry_scheduled",
        {"step": step.index, "attempt": step.attempt_count, "delay_s": delay, "cap_s": cap, "error": err},
    )


def abandon_open_steps(tx: StepTxn) -> None:
    """The task ends now: its open steps fail (on the task row: `tasks.history` shows them)."""
    err = dict(ABANDONED)
    for s in sorted(tx.task.steps.values(), key=lambda s: s.index):
        if s.status == StepStatus.RUNNING:
            tx.finish_attempt(s, "LOST", error=err)
        if s.status in (StepStatus.PENDING, StepStatus.RUNNING, StepStatus.RETRY_WAIT):
            tx.step_transition(s, StepEvent.ABANDON, error=err)


def budget_error(which: str, limit: int) -> dict[str, Any]:
    return {
        "kind": "budget_exhausted",
        "budget": which,
        "limit": limit,
        "message": f"{which} budget of {limit} used up",
    }

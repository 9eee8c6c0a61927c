"""The runner's per-task log: one structured line when it takes a task, after each step attempt,
and when it lets the task go (`task.end` in a final state, else `task.release`), on the
`dayzero.task` logger. Fields (logfmt through `orchestrator.logs`): `task`, `runner`, `status`,
`step`, `kind`, `tool`, `attempt`, `outcome`, `ms`, and the task's totals so far `steps`,
`tokens_in`, `tokens_cached`, `tokens_out`. Never a message's content: goals, tool arguments and
answers stay in the database.
"""

from __future__ import annotations

import logging
from typing import Any

from orchestrator.runner.txn import StepView, TaskView
from orchestrator.statemachine import TERMINAL_TASK_STATUSES, TaskStatus

log = logging.getLogger("dayzero.task")


def _totals(task: TaskView) -> dict[str, Any]:
    return {
        "steps": task.step_count,
        "tokens_in": task.prompt_tokens,
        "tokens_cached": task.cached_tokens,
        "tokens_out": task.completion_tokens,
    }


def claimed(task: TaskView, runner_id: str) -> None:
    if not log.isEnabledFor(logging.INFO):  # the fields are not even built when nobody listens
        return
    log.info(
        "task.start",
        extra={"kv": {"task": task.id, "runner": runner_id, "status": task.status, **_totals(task)}},
    )


def step_done(task: TaskView, step: StepView, outcome: str, seconds: float) -> None:
    if not log.isEnabledFor(logging.INFO):
        return
    kv: dict[str, Any] = {"task": task.id, "step": step.index, "kind": step.kind}
    if step.tool_name:
        kv["tool"] = step.tool_name
    kv.update(attempt=step.attempt_count, outcome=outcome, ms=seconds * 1000, **_totals(task))
    log.info("task.step", extra={"kv": kv})


def left(task: TaskView, runner_id: str, stopping: bool) -> None:
    """The runner lets the task go: finished, parked (a retry wait, attachments being processed),
    or given up (this runner is stopping, or lost its lease; another runner resumes it)."""
    if not log.isEnabledFor(logging.INFO):
        return
    kv = {"task": task.id, "runner": runner_id, "status": task.status, **_totals(task)}
    if TaskStatus(task.status) in TERMINAL_TASK_STATUSES:
        log.info("task.end", extra={"kv": kv})
    else:
        log.info("task.release", extra={"kv": {**kv, "stopping": stopping}})

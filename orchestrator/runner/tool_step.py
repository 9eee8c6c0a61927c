"""The tool step: the task's allow-list, the in-doubt rule, one attempt through the dispatcher,
then the outcome's transaction (retry, error shown to the model, or the next step)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from sqlalchemy import select

from core.payloads import AttachmentRef, ToolJob, idempotency_key
from core.retry import RetryPolicy
from orchestrator.clock import utcnow
from orchestrator.db.tables import attempts_t
from orchestrator.failpoints import failpoint
from orchestrator.metrics import TOOL_ATTEMPTS
from orchestrator.retry import Decision, decide_tool
from orchestrator.runner.boundary import abandon_open_steps, budget_error, schedule_retry
from orchestrator.runner.txn import StepTxn, StepView, TaskView
from orchestrator.runner.workspaces import workspace_path
from orchestrator.statemachine import StepEvent, StepStatus, TaskEvent
from orchestrator.tracing import current_traceparent, trace_error
from tools.base import ErrorKind, ToolError, ToolSpec
from workers.fence import not_after as job_not_after

if TYPE_CHECKING:
    from orchestrator.runner.context import StepContext


def tool_spec(r: StepContext, name: str | None) -> ToolSpec | None:
    try:
        return r.tools.spec(name or "")
    except ToolError:
        return None


def previous_error(r: StepContext, task: TaskView, step: StepView) -> dict[str, Any] | None:
    """The error of the step's attempt before this one (None on a first attempt)."""
    if step.attempt_count <= 1:
        return None
    a = attempts_t.c
    with r.conn.begin():  # its own short transaction: the step's commit needs none open
        return r.conn.execute(
            select(a.error).where(
                a.task_id == task.id, a.step_index == step.index, a.attempt == step.attempt_count - 1
            )
        ).scalar_one_or_none()


def tool_job(r: StepContext, task: TaskView, step: StepView, timeout_s: float) -> ToolJob:
    path = workspace_path(r.config.workspace_dir, task.tenant, task.id)
    workspace = str(path) if path is not None else None
    return ToolJob(
        tool=step.tool_name or "",
        arguments=step.arguments or "",
        task_id=task.id,
        step_index=step.index,
        attempt=step.attempt_count,
        idempotency_key=idempotency_key(
            task.id, step.index, step.attempt_count, previous_error(r, task, step)
        ),
        timeout_s=timeout_s,
        workspace=workspace,
        attachments=tuple(AttachmentRef.from_dict(a) for a in task.attachments),
        traceparent=current_traceparent() or task.traceparent,
        runner_id=r.config.runner_id,
        not_after=job_not_after(timeout_s),
    )


def run_tool_step(r: StepContext, task: TaskView, step: StepView, *, in_doubt: bool) -> None:
    spec = tool_spec(r, step.tool_name)
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
        sig = r.cancel_signal
        outcome = r.dispatcher.run_tool(tool_job(r, task, step, timeout_s), cancel=sig.event if sig else None)
        failpoint("after_tool")
        if sig is not None and sig.event.is_set():
            return  # cancelled meanwhile: the job is revoked or abandoned, its result ignored
        lost = False
    tx = r.txn(task)
    record_tool_outcome(tx, step, spec, outcome, lost=lost, offload=r.offload_payload)
    tx.commit(r.conn)


def record_tool_outcome(
    tx: StepTxn,
    step: StepView,
    spec: ToolSpec | None,
    outcome: dict[str, Any],
    *,
    lost: bool,
    offload: Callable[[str], Any] | None = None,
) -> None:
    """`offload`: what the history row stores for a result's text (a blob reference for a big
    one: `runner.payloads`); the model is shown the text."""
    task = tx.task
    span = trace.get_current_span()
    if outcome.get("ok"):
        TOOL_ATTEMPTS.labels(step.tool_name or "", "ok").inc()
        span.set_attribute("dayzero.tool.outcome", "ok")
        content = outcome.get("content")
        tx.succeed_step(step)
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
            schedule_retry(tx, step, decision, err)
            return
        tx.step_transition(step, StepEvent.FAIL, error=err)
        tx.event("step.failed", {"step": step.index, "kind": "tool", "tool": step.tool_name, "error": err})
        if spec is not None and spec.retry.fail_task_on_exhaustion and decision.exhausted:
            tx.task_transition(TaskEvent.FAIL, error={"kind": "tool", "tool": step.tool_name, **err})
            return
        content = err  # the model reads the error as the tool's result
    task.step_count += 1
    text = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False, default=str)
    stored = offload(text) if offload is not None else text
    tx.append_message(
        {"role": "tool", "tool_call_id": step.tool_call_id, "content": text},
        step.index,
        stored_content=stored,
    )
    if task.cancel_requested or tx.now >= task.deadline_at:
        return  # the next loop turn ends the task at this boundary
    nxt = task.open_step()
    if task.step_count >= task.max_steps:
        abandon_open_steps(tx)
        tx.task_transition(TaskEvent.FAIL, error=budget_error("max_steps", task.max_steps))
    elif nxt is not None:
        tx.start_attempt(nxt)
    else:
        tx.add_step(StepView(index=task.next_step_index, kind="model", status=StepStatus.PENDING), start=True)

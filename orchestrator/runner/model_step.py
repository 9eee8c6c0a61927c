"""The model step: one chat turn through the inference client, then its transaction."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from core.outage import OutageOutlasted, wait_out
from orchestrator.attachments import AttachmentError, resolve_images
from orchestrator.clock import utcnow
from orchestrator.inference_client import AssistantTurn, InferenceError, Sampling
from orchestrator.metrics import MODEL_TOKENS, MODEL_TTFT
from orchestrator.retry import decide
from orchestrator.runner.boundary import budget_error, schedule_retry
from orchestrator.runner.txn import StepView, TaskView
from orchestrator.statemachine import StepEvent, StepStatus, TaskEvent
from orchestrator.tracing import trace_error
from tools.base import ErrorKind

if TYPE_CHECKING:
    from orchestrator.runner.loop import Runner


def _chat_waiting_out_outages(
    r: Runner, task: TaskView, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> AssistantTurn:
    """The model call; a model server that is down or restarting is waited out (readiness says
    so), up to the task's deadline, like the database and the brokers: a restart of the server
    must not cost the step its attempts."""
    deadline = time.monotonic() + (task.deadline_at - utcnow()).total_seconds()
    sampling = Sampling.from_mapping(task.sampling)
    return wait_out(
        "inference",
        lambda: r.inference.chat(messages, tools, sampling),
        stop=r.stopping,
        readiness=r.health,
        deadline=deadline,
    )


def run_model_step(r: Runner, task: TaskView, step: StepView) -> None:
    if task.offered_tools is None:
        task.offered_tools = r.tools.openai_tools(task.allowed_tools)
    tools = task.offered_tools
    try:
        messages = task.transcript
        if task.attachments:
            by_reference = bool(getattr(r.inference, "images_by_reference", False))
            messages = resolve_images(
                messages, task.attachments, r.config.blob_url, by_reference=by_reference
            )
        turn = _chat_waiting_out_outages(r, task, messages, tools)
        error: InferenceError | None = None
    except OutageOutlasted:
        return  # the model server was away until the deadline: the next loop turn times the task out
    except InferenceError as exc:
        turn, error = None, exc
    except AttachmentError as exc:  # the same transcript can never resolve: permanent
        turn, error = None, InferenceError(str(exc), retryable=False)
    tx = r.txn(task)
    if error is not None or turn is None:
        trace_error(trace.get_current_span(), "InferenceError", str(error))
        policy = r.config.model_retry
        err = {"kind": "inference", "message": str(error), "retryable": bool(error and error.retryable)}
        tx.finish_attempt(step, "FAILED", error=err)
        kind = ErrorKind.RETRYABLE if err["retryable"] else ErrorKind.PERMANENT
        decision = decide(policy, kind, step.attempt_count)  # a model call has no side effect
        if decision.retry:
            schedule_retry(tx, step, decision, err)
        else:
            tx.step_transition(step, StepEvent.FAIL, error=err)
            tx.event("step.failed", {"step": step.index, "kind": "model", "error": err})
            tx.task_transition(TaskEvent.FAIL, error=err)
        tx.commit(r.conn)
        return
    usage = turn.usage
    MODEL_TOKENS.labels("prompt").inc(usage.prompt_tokens)
    MODEL_TOKENS.labels("cached").inc(usage.cached_tokens)
    MODEL_TOKENS.labels("completion").inc(usage.completion_tokens)
    if usage.ttft_ms is not None:
        MODEL_TTFT.observe(usage.ttft_ms / 1000)
    tx.succeed_step(step, usage=usage.to_dict())
    task.step_count += 1
    task.prompt_tokens += usage.prompt_tokens
    task.cached_tokens += usage.cached_tokens
    task.completion_tokens += usage.completion_tokens
    tx.append_message(turn.message(), step.index)
    # Usage is kept on the step row (its successful attempt); the event carries the token total only.
    tokens = usage.prompt_tokens + usage.completion_tokens
    tx.event(
        "step.succeeded",
        {"step": step.index, "kind": "model", "calls": len(turn.tool_calls), "tokens": tokens},
    )
    if not turn.tool_calls:
        tx.task_transition(TaskEvent.SUCCEED, result=turn.content or "")
    elif task.total_tokens >= task.max_tokens:
        tx.task_transition(TaskEvent.FAIL, error=budget_error("max_tokens", task.max_tokens))
    elif task.step_count >= task.max_steps:
        tx.task_transition(TaskEvent.FAIL, error=budget_error("max_steps", task.max_steps))
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
    tx.commit(r.conn)

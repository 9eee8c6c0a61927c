"""The model step: one chat turn through the inference client, then its transaction."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from opentelemetry import trace

from core.outage import OutageOutlasted, wait_out
from orchestrator.attachments import AttachmentError, resolve_images
from orchestrator.clock import utcnow
from orchestrator.inference_client import (
    AssistantTurn,
    InferenceCancelled,
    InferenceError,
    ModelContextExceeded,
    Sampling,
    Usage,
    output_problem,
)
from orchestrator.metrics import MODEL_TOKENS, MODEL_TTFT
from orchestrator.retry import decide
from orchestrator.runner.boundary import budget_error, schedule_retry
from orchestrator.runner.payloads import ContextExceeded, apply_context_policy
from orchestrator.runner.txn import StepView, TaskView
from orchestrator.statemachine import StepEvent, StepStatus, TaskEvent
from orchestrator.tasks.queries import list_attempts
from orchestrator.tracing import trace_error
from tools.base import ErrorKind

if TYPE_CHECKING:
    from orchestrator.runner.context import StepContext


def _chat_waiting_out_outages(
    r: StepContext, task: TaskView, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> AssistantTurn:
    """The model call; a model server that is down or restarting is waited out (readiness says
    so), up to the task's deadline, like the database and the brokers: a restart of the server
    must not cost the step its attempts."""
    deadline = time.monotonic() + (task.deadline_at - utcnow()).total_seconds()
    sampling = replace(Sampling.from_mapping(task.sampling), cache_key=str(task.id))
    return wait_out(
        "inference",
        lambda: r.inference.chat(messages, tools, sampling),
        stop=r.stopping,
        readiness=r.health,
        deadline=deadline,
    )


def run_model_step(r: StepContext, task: TaskView, step: StepView) -> None:
    t0 = time.perf_counter()
    if task.offered_tools is None:
        task.offered_tools = r.tools.openai_tools(task.allowed_tools)
    tools = task.offered_tools
    sig = r.cancel_signal
    try:
        messages = task.transcript
        if task.attachments:
            # resolved once per message and claim: later turns send the same objects again
            # (the incremental wire form tells them apart by identity)
            by_reference = bool(getattr(r.inference, "images_by_reference", False))
            done = task.resolved_messages
            done += resolve_images(
                messages[len(done) :],
                task.attachments,
                r.config.blob_url,
                by_reference=by_reference,
                texts=r.payloads.text,
            )
            messages = list(done)
        messages, task.context_trimmed = apply_context_policy(
            messages,
            cap=task.max_context_tokens,
            policy=task.context_policy,
            known=task.last_prompt,
            trimmed=task.context_trimmed,
            notices=task.context_notices,
        )
        sent = len(messages)
        if (feedback := _feedback(r, task, step)) is not None:
            messages = [*messages, feedback]
            sent = -1  # not the transcript: its count bounds nothing
        if sig is not None and (abort := getattr(r.inference, "abort", None)) is not None:
            sig.add_abort(abort)  # a cancel closes the request: the server frees its slot
        runner_ms = (time.perf_counter() - t0) * 1000.0
        turn = _chat_waiting_out_outages(r, task, messages, tools)
        turn = replace(turn, usage=replace(turn.usage, runner_ms=runner_ms))
        error: InferenceError | None = None
    except (OutageOutlasted, InferenceCancelled):
        # The model server was away until the deadline, or the task was cancelled: nothing to
        # record, the next loop turn ends the task.
        return
    except ModelContextExceeded as exc:  # the server's context, as the task's own cap: typed, no retry
        trace_error(trace.get_current_span(), "context_exceeded", str(exc))
        _fail_attempt(r, task, step, {"kind": "context_exceeded", "message": str(exc), "retryable": False})
        return
    except InferenceError as exc:
        turn, error = None, exc
    except AttachmentError as exc:  # the same transcript can never resolve: permanent
        turn, error = None, InferenceError(str(exc), retryable=False)
    except ContextExceeded as exc:  # the task's context policy: a typed failure, no retry
        trace_error(trace.get_current_span(), "context_exceeded", str(exc))
        _fail_attempt(r, task, step, exc.error())
        return
    if error is not None or turn is None:
        trace_error(trace.get_current_span(), "InferenceError", str(error))
        retryable = bool(error and error.retryable)
        _fail_attempt(r, task, step, {"kind": "inference", "message": str(error), "retryable": retryable})
        return
    if (problem := output_problem(turn)) is not None:
        # Never an answer: retried with the problem shown to the model, then the task fails typed.
        trace_error(trace.get_current_span(), UNPARSEABLE, problem)
        task.model_feedback[step.index] = problem
        _count_usage(task, turn.usage)
        err = {"kind": UNPARSEABLE, "message": problem, "retryable": True}
        _fail_attempt(r, task, step, err, usage=turn.usage.to_dict())
        return
    if sig is not None and (sig.event.is_set() or (not turn.tool_calls and sig.requested())):
        return  # cancelled while the answer was on its way: the task ends CANCELLED, not SUCCEEDED
    task.model_feedback.pop(step.index, None)
    usage = turn.usage
    task.last_prompt = (sent, usage.prompt_tokens) if sent >= 0 and usage.prompt_tokens else None
    tx = r.txn(task)
    tx.succeed_step(step, usage=usage.to_dict())
    task.step_count += 1
    _count_usage(task, usage)
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


UNPARSEABLE = "model_output_unparseable"


def _count_usage(task: TaskView, usage: Usage) -> None:
    MODEL_TOKENS.labels("prompt").inc(usage.prompt_tokens)
    MODEL_TOKENS.labels("cached").inc(usage.cached_tokens)
    MODEL_TOKENS.labels("completion").inc(usage.completion_tokens)
    if usage.ttft_ms is not None:
        MODEL_TTFT.observe(usage.ttft_ms / 1000)
    task.prompt_tokens += usage.prompt_tokens
    task.cached_tokens += usage.cached_tokens
    task.completion_tokens += usage.completion_tokens


def _fail_attempt(
    r: StepContext, task: TaskView, step: StepView, err: dict[str, Any], usage: dict[str, Any] | None = None
) -> None:
    """A failed model attempt, by the one retry rule: again after a backoff, or the task fails."""
    tx = r.txn(task)
    tx.finish_attempt(step, "FAILED", error=err, usage=usage)
    kind = ErrorKind.RETRYABLE if err["retryable"] else ErrorKind.PERMANENT
    decision = decide(r.config.model_retry, kind, step.attempt_count)  # a model call has no side effect
    if decision.retry:
        schedule_retry(tx, step, decision, err)
    else:
        tx.step_transition(step, StepEvent.FAIL, error=err)
        tx.event("step.failed", {"step": step.index, "kind": "model", "error": err})
        tx.task_transition(TaskEvent.FAIL, error=err)
    tx.commit(r.conn)


def _feedback(r: StepContext, task: TaskView, step: StepView) -> dict[str, Any] | None:
    """On the retry of a turn whose output could not be used: a message telling the model what
    was wrong (from memory, or from the failed attempt when another runner made it)."""
    if step.attempt_count <= 1:
        return None
    problem = task.model_feedback.get(step.index)
    if problem is None:
        with r.engine.connect() as conn:
            failed = [a for a in list_attempts(conn, task.id) if a.step_index == step.index and a.error]
        last = failed[-1].error if failed else None
        if not (isinstance(last, dict) and last.get("kind") == UNPARSEABLE):
            return None
        problem = str(last.get("message"))
    return {
        "role": "user",
        "content": f"Your previous reply could not be used: {problem}. Reply again: call a tool "
        "with valid JSON arguments matching its schema, or answer in plain text.",
    }

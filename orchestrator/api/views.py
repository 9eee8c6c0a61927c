"""DB rows → API response models."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from sqlalchemy import Row

from orchestrator.api.schemas import (
    AttachmentOut,
    AttemptOut,
    Limits,
    StepOut,
    TaskDetail,
    TaskSummary,
    Usage,
)

_NEW_TASK_DEFAULTS = {
    "step_count": 0,
    "prompt_tokens": 0,
    "cached_tokens": 0,
    "completion_tokens": 0,
    "result": None,
    "error": None,
    "cancel_requested": False,
    "finished_at": None,
}


def new_task_row(values: dict[str, Any]) -> SimpleNamespace:
    """A just-inserted task's values (plus server defaults) in the shape of a `tasks` row."""
    return SimpleNamespace(**{**_NEW_TASK_DEFAULTS, **values})


def task_summary(t: Any, goal: str | None) -> TaskSummary:
    return TaskSummary(
        id=t.id,
        status=t.status,
        goal=goal,
        idempotency_key=t.idempotency_key,
        metadata=t.metadata,
        allowed_tools=t.allowed_tools,
        limits=Limits(
            max_steps=t.max_steps,
            max_tokens=t.max_tokens,
            deadline_at=t.deadline_at,
            max_context_tokens=getattr(t, "max_context_tokens", None),
            context_policy=getattr(t, "context_policy", None),
        ),
        usage=Usage(
            steps=t.step_count,
            prompt_tokens=t.prompt_tokens,
            cached_tokens=t.cached_tokens,
            completion_tokens=t.completion_tokens,
        ),
        result=t.result,
        error=t.error,
        cancel_requested=t.cancel_requested,
        created_at=t.created_at,
        updated_at=t.updated_at,
        finished_at=t.finished_at,
    )


def task_detail(t: Row[Any], goal: str | None, steps: list[Row[Any]], attempts: list[Row[Any]]) -> TaskDetail:
    by_step: dict[int, list[AttemptOut]] = {}
    for a in attempts:
        by_step.setdefault(a.step_index, []).append(
            AttemptOut(
                attempt=a.attempt,
                status=a.status,
                runner_id=a.runner_id,
                resumed=a.resumed,
                error=a.error,
                usage=a.usage,
                started_at=a.started_at,
                finished_at=a.finished_at,
            )
        )
    return TaskDetail(
        **task_summary(t, goal).model_dump(),
        steps=[
            StepOut(
                index=s.step_index,
                kind=s.kind,
                status=s.status,
                tool_name=s.tool_name,
                tool_call_id=s.tool_call_id,
                arguments=s.arguments,
                attempt_count=s.attempt_count,
                error=s.error,
                created_at=s.created_at,
                finished_at=s.finished_at,
                attempts=by_step.get(s.step_index, []),
            )
            for s in steps
        ],
    )


def attachment_out(a: Row[Any]) -> AttachmentOut:
    return AttachmentOut(
        id=a.id,
        status=a.status,
        media_type=a.media_type,
        filename=a.filename,
        size_bytes=a.size_bytes,
        sha256=a.sha256,
        task_id=a.task_id,
        created_at=a.created_at,
    )

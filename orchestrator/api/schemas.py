"""The REST API's response schemas (Pydantic). The task body and its rules are the task model's
(`orchestrator/tasks/schemas.py`)."""

from __future__ import annotations

import datetime as dt
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# -- responses ---------------------------------------------------------------------------------


class Usage(BaseModel):
    steps: int
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int


class Limits(BaseModel):
    max_steps: int
    max_tokens: int
    deadline_at: dt.datetime
    max_context_tokens: int | None = None
    context_policy: str | None = None


class AttemptOut(BaseModel):
    attempt: int
    status: str
    runner_id: str
    resumed: int
    error: dict[str, Any] | None
    usage: dict[str, Any] | None
    started_at: dt.datetime
    finished_at: dt.datetime | None


class StepOut(BaseModel):
    index: int
    kind: str
    status: str
    tool_name: str | None
    tool_call_id: str | None
    arguments: str | None
    attempt_count: int
    error: dict[str, Any] | None
    created_at: dt.datetime
    finished_at: dt.datetime | None
    attempts: list[AttemptOut]


class TaskSummary(BaseModel):
    id: str
    status: Literal[
        "PENDING",
        "PREPROCESSING",
        "READY",
        "RUNNING",
        "WAITING",
        "SUCCEEDED",
        "FAILED",
        "CANCELLED",
        "TIMED_OUT",
    ]
    goal: str | None = Field(description="the goal's text (its attachments left out)")
    idempotency_key: str | None
    metadata: dict[str, Any] | None
    allowed_tools: list[str] | None
    limits: Limits
    usage: Usage
    result: str | None
    error: dict[str, Any] | None
    cancel_requested: bool
    created_at: dt.datetime
    updated_at: dt.datetime
    finished_at: dt.datetime | None


class TaskDetail(TaskSummary):
    steps: list[StepOut]


class TranscriptMessage(BaseModel):
    """One message of a task's transcript, in OpenAI chat format."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[dict[str, Any]] | None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None


class TaskPage(BaseModel):
    items: list[TaskSummary]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


class AttachmentOut(BaseModel):
    id: str
    status: str
    media_type: str
    filename: str | None
    size_bytes: int
    sha256: str
    task_id: str | None
    created_at: dt.datetime


class Health(BaseModel):
    status: Literal["ok"]


class Readiness(BaseModel):
    status: Literal["ready"]
    revision: str | None


class Problem(BaseModel):
    """RFC 9457 problem details."""

    model_config = ConfigDict(extra="allow")

    type: str = "about:blank"
    title: str
    status: int
    detail: str | None = None
    instance: str | None = None
    errors: list[dict[str, Any]] | None = None
    task_id: str | None = None

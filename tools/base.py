"""The tool protocol: what a tool declares, what it receives, what it returns.

Tools know nothing of tasks or the database: the runner passes a `ToolContext` with what a tool
may need (ids, idempotency key, workspace, attachments) and receives a `ToolResult` or a typed
`ToolError`. Retry decisions are made by the orchestrator (`orchestrator.retry`) from the tool's `RetryPolicy`.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from core.retry import RetryPolicy  # a tool declares its policy with it (re-exported)


class ErrorKind(str, enum.Enum):  # noqa: UP042 (str() and format() must stay as they are)
    """How the orchestrator should treat a failure."""

    RETRYABLE = "retryable"  # transient: try again per the policy
    PERMANENT = "permanent"  # the same call will fail again; tell the model
    INVALID_ARGUMENTS = "invalid_arguments"  # schema violation, unknown tool, oversize: tell the model
    TIMEOUT = "timeout"  # the attempt ran past its timeout


class ToolError(Exception):
    """A failure a tool reports; `kind` tells the orchestrator whether to retry."""

    kind: ErrorKind = ErrorKind.PERMANENT

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind | None = None,
        details: Mapping[str, Any] | None = None,
        started: bool | None = None,
    ):
        super().__init__(message)
        if kind is not None:
            self.kind = kind
        self.details = dict(details or {})
        # Whether the tool may have begun its side effect: None = unknown (treated as yes), False =
        # it failed before touching anything, so even a non-idempotent tool may be retried.
        self.started = started

    def to_dict(self) -> dict[str, Any]:
        """The JSON the job returns and the model reads; `started` travels when the tool knows it."""
        return {
            "error": str(self),
            "kind": self.kind.value,
            **({"details": self.details} if self.details else {}),
            **({"started": self.started} if self.started is not None else {}),
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolError:
        """The error `to_dict()` described (an unknown kind reads as permanent)."""
        try:
            kind = ErrorKind(d.get("kind"))
        except ValueError:
            kind = ErrorKind.PERMANENT
        started = d.get("started")
        return cls(
            str(d.get("error") or d.get("message") or "tool failed"),
            kind=kind,
            details=d.get("details"),
            started=started if isinstance(started, bool) else None,
        )


class RetryableToolError(ToolError):
    kind = ErrorKind.RETRYABLE


class PermanentToolError(ToolError):
    kind = ErrorKind.PERMANENT


class InvalidArgumentsError(ToolError):
    kind = ErrorKind.INVALID_ARGUMENTS

    def __init__(self, message: str, **kwargs: Any):
        kwargs.setdefault("started", False)  # raised before the tool ran (schema, size, unknown tool)
        super().__init__(message, **kwargs)


class UnknownToolError(InvalidArgumentsError):
    pass


class ToolTimeoutError(ToolError):
    kind = ErrorKind.TIMEOUT


@dataclass(frozen=True, slots=True)
class ToolSpec:
    """What a tool declares about itself."""

    name: str
    description: str
    parameters: Mapping[str, Any]  # JSON Schema of the arguments
    result_schema: Mapping[str, Any] | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    # Safe to run twice with the same arguments (reads, pure functions).
    idempotent: bool = True
    # Has side effects but dedupes on `ToolContext.idempotency_key`.
    accepts_idempotency_key: bool = False
    resources: tuple[str, ...] = ()  # e.g. ("workspace", "attachments", "network")
    max_argument_bytes: int = 64 * 1024
    # Runs on the runner's own thread under the in-process dispatcher, without the hand-off to a
    # pool thread (~0.25 ms of runner CPU per call): for fast, idempotent tools that cannot hang
    # (pure functions, lookups in memory). Its timeout is not enforced: a call cannot be
    # abandoned half-way on the caller's thread. Celery workers run every tool alike.
    inline: bool = False

    def openai_tool(self) -> dict[str, Any]:
        """The entry of the OpenAI `tools` list for this tool. Strict: a server that constrains
        decoding (ours does) produces only calls that match `parameters`."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": dict(self.parameters),
                "strict": True,
            },
        }


@dataclass(frozen=True, slots=True)
class Attachment:
    """An attachment the task owns, as a tool sees it."""

    id: str
    media_type: str
    path: Path | None = None  # local file with the original bytes (blob store)
    text: str | None = None  # decoded text, for text attachments
    content_hash: str | None = None


@dataclass(frozen=True, slots=True)
class ToolContext:
    """Everything a tool may use, passed by the runner."""

    task_id: str
    step_id: str
    attempt: int
    idempotency_key: str  # "task_id:step_id:attempt"
    workspace: Path | None = None
    attachments: tuple[Attachment, ...] = ()
    deadline_s: float | None = None  # seconds left for this attempt


@dataclass(frozen=True, slots=True)
class ToolResult:
    """A successful tool result; `content` is what the model reads (JSON-serialisable)."""

    content: Any
    metadata: Mapping[str, Any] = field(default_factory=dict)


@runtime_checkable
class Tool(Protocol):
    spec: ToolSpec

    def run(self, arguments: Mapping[str, Any], context: ToolContext) -> ToolResult: ...

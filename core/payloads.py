"""The typed payloads of the two job kinds, shared by the dispatcher (sender) and the workers.

They travel as JSON (Celery's serializer; `to_dict` / `from_dict`), or as objects through the
in-process dispatcher. `from_dict` raises `KeyError`/`TypeError`/`ValueError` on a malformed
payload: the job reports that as its own failure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class AttachmentRef:
    """An attachment as a tool job carries it (the file to read, or its decoded text)."""

    id: str
    media_type: str
    path: str | None = None
    text: str | None = None
    content_hash: str | None = None

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> AttachmentRef:
        return cls(
            id=str(d["id"]),
            media_type=str(d["media_type"]),
            path=d.get("path"),
            text=d.get("text"),
            content_hash=d.get("content_hash"),
        )


# Set on a failed attempt's error when the job may have run (sent, then no result: a timeout, a
# revocation, a result lost with the backend), with the key it ran under.
OUTCOME_UNKNOWN = "outcome_unknown"


def idempotency_key(
    task_id: str, step_index: int, attempt: int, previous_error: Mapping[str, Any] | None = None
) -> str:
    """The key a tool attempt runs under: `task_id:step_index:attempt`, except after an attempt
    whose outcome is unknown, whose key it reuses, so that a tool that dedups on its key does
    the side effect once. An attempt known to have failed (or not to have run) gets a fresh key."""
    if previous_error and previous_error.get(OUTCOME_UNKNOWN) and previous_error.get("idempotency_key"):
        return str(previous_error["idempotency_key"])
    return f"{task_id}:{step_index}:{attempt}"


def unknown_outcome(error: dict[str, Any], key: str) -> dict[str, Any]:
    """Mark a failed attempt's error as one whose job may have run under `key`."""
    return {**error, OUTCOME_UNKNOWN: True, "idempotency_key": key}


@dataclass(frozen=True, slots=True)
class ToolJob:
    """One tool attempt (`dayzero.run_tool`)."""

    tool: str
    arguments: str  # the model's JSON text, validated by the registry
    task_id: str
    step_index: int
    attempt: int
    idempotency_key: str  # see `idempotency_key`
    timeout_s: float
    workspace: str | None = None
    attachments: tuple[AttachmentRef, ...] = ()
    traceparent: str | None = None
    # The late-duplicate check of a redelivered job (workers.fence): who sent it, and when
    # nobody waits for it any more.
    runner_id: str | None = None
    not_after: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> ToolJob:
        tool, arguments = d["tool"], d.get("arguments") or "{}"
        if not isinstance(tool, str) or not isinstance(arguments, str):
            raise TypeError("'tool' and 'arguments' must be strings")
        return cls(
            tool=tool,
            arguments=arguments,
            task_id=str(d["task_id"]),
            step_index=int(d["step_index"]),
            attempt=int(d["attempt"]),
            idempotency_key=str(d["idempotency_key"]),
            timeout_s=float(d.get("timeout_s") or 0.0),
            workspace=d.get("workspace"),
            attachments=tuple(AttachmentRef.from_dict(a) for a in d.get("attachments") or ()),
            traceparent=d.get("traceparent"),
            runner_id=d.get("runner_id"),
            not_after=None if d.get("not_after") is None else float(d["not_after"]),
        )


@dataclass(frozen=True, slots=True)
class PreprocessJob:
    """Preprocess one stored attachment (`dayzero.preprocess_attachment`)."""

    attachment_id: str
    blob_sha256: str
    blob_url: str  # the BlobStore root
    media_type: str | None = None
    config: Mapping[str, Any] = field(default_factory=dict)  # PreprocessConfig fields
    traceparent: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "config": dict(self.config)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> PreprocessJob:
        missing = [key for key in ("attachment_id", "blob_sha256", "blob_url") if not d.get(key)]
        if missing:
            raise ValueError(f"preprocess_attachment payload lacks {missing}")
        return cls(
            attachment_id=str(d["attachment_id"]),
            blob_sha256=str(d["blob_sha256"]),
            blob_url=str(d["blob_url"]),
            media_type=d.get("media_type"),
            config=dict(d.get("config") or {}),
            traceparent=d.get("traceparent"),
        )

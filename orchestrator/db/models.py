"""SQLAlchemy 2.0 models: the schema of record. Alembic migrations must match it exactly.

Write-path notes (they keep WAL per step small):
- A step writes ONE row besides its task row: its `events` row is the task's history (migration
  0011). It is the outbox event and, on the event that finishes a step (`step.succeeded` /
  `step.failed`), also that step's outcome (`step_index`, `step_status`, the successful
  attempt's columns) and the transcript message the step appended (`role`, `content`, ...).
  One heap row and two index entries per step instead of three rows and four entries.
- The step in progress lives on the task row (`open_*`, `next_step`): steps run strictly in
  order, so the open steps are `open_step .. next_step - 1`, the first at `open_status` /
  `open_attempt`, the others (tool calls of the same model turn) PENDING. A tool step's name,
  call id and arguments are those of its model turn's tool call (`tasks.history` derives them).
- The per-step tables (`step_attempts`, `messages`) carry no foreign keys: each FK check
  locks the parent row and logs that lock, on every insert. Only the runner, holding the task's
  lease, writes them; deleting a task deletes them explicitly (`tasks.control.delete_task`).
- `tasks` rows stay narrow; the goal lives in `messages` (written at creation), the rest of
  the transcript on the history rows, appended, never rewritten.
- `step_attempts` holds failed/lost tries only (the successful one is on the history row).
- `events` is the transactional outbox: one row per state change, written in the same
  transaction as the change (always after that transaction's write to the task row: the relay's
  cursor relies on it, see `orchestrator.kafka.relay`). Nothing is written back to a row once it
  is published: the relay keeps its position in `relay_cursors`. Rows migrated from the old
  `steps`/`messages` tables carry no event (`type` NULL, `seq` < 0): readers of events skip them.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    UniqueConstraint,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from orchestrator.db.types import BigIntId, JSONText, JSONType, UTCDateTime
from orchestrator.statemachine import CLAIMABLE_TASK_STATUSES

# The claim's filter, literal so the planner can match it to the partial index `ix_tasks_claimable`.
CLAIMABLE_SQL = "status IN ({})".format(", ".join(f"'{s.value}'" for s in sorted(CLAIMABLE_TASK_STATUSES)))


class Base(DeclarativeBase):
    pass


class Task(Base):
    __tablename__ = "tasks"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), nullable=False)
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    request_hash: Mapped[str | None] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), nullable=False)
    allowed_tools: Mapped[list[str] | None] = mapped_column(JSONType)
    sampling: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    metadata_: Mapped[dict[str, Any] | None] = mapped_column("metadata", JSONType)
    max_steps: Mapped[int] = mapped_column(Integer, nullable=False)
    max_tokens: Mapped[int] = mapped_column(Integer, nullable=False)
    # the context-window policy (migration 0012; `runner.payloads`): NULL, no cap
    max_context_tokens: Mapped[int | None] = mapped_column(Integer)
    context_policy: Mapped[str | None] = mapped_column(String(32))
    # where the policy stands (migration 0013; `runner.payloads.ContextState`): NULL, no cap
    context_state: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    deadline_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    result: Mapped[str | None] = mapped_column(Text)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, nullable=False, server_default=text("false"))
    # Lease: who works on the task, until when; when it may next be claimed.
    lease_owner: Mapped[str | None] = mapped_column(String(64))
    next_run_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    traceparent: Mapped[str | None] = mapped_column(String(64))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    # Last, and adjacent: the columns every step's transaction rewrites (progress, usage, the
    # outbox counter, the lease), so that its HOT update logs only them (migration 0008).
    step_count: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    prompt_tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    cached_tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    completion_tokens: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    event_seq: Mapped[int] = mapped_column(BigInteger, nullable=False, server_default=text("0"))
    lease_until: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    # The open step (migration 0011): what changes at every step first (next to the block
    # above), what changes only with a retry, a resumption or the task's end after it.
    open_started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    open_step: Mapped[int | None] = mapped_column(Integer)
    next_step: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    # RUNNING | PENDING | RETRY_WAIT, or FAILED: the open steps were abandoned with the task.
    open_status: Mapped[str | None] = mapped_column(String(16))
    open_attempt: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    open_runner_id: Mapped[str | None] = mapped_column(String(64))  # who started the attempt
    open_next_attempt_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key", name="uq_tasks_tenant_idempotency_key"),
        Index("ix_tasks_claim", "status", "next_run_at"),
        # The claim reads the claimable tasks in `next_run_at` order from here and stops at the
        # first it can lock: O(1) per claim, however long the queue (migration 0007).
        Index(
            "ix_tasks_claimable",
            "next_run_at",
            postgresql_where=text(CLAIMABLE_SQL),
            sqlite_where=text(CLAIMABLE_SQL),
        ),
        Index("ix_tasks_tenant_created", "tenant", "created_at"),
    )


class StepAttempt(Base):
    """One failed or lost try of a step (append-only). The idempotency key a tool sees is
    `task_id:step_index:attempt`; the attempt in flight is described by the task row (`open_*`),
    the one that succeeded by the step's history row (`Event`)."""

    __tablename__ = "step_attempts"

    task_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    step_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    attempt: Mapped[int] = mapped_column(Integer, primary_key=True)
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # SUCCEEDED | FAILED | LOST
    runner_id: Mapped[str] = mapped_column(String(64), nullable=False)
    # How often a runner took over this attempt after another died mid-way (same idempotency key).
    resumed: Mapped[int] = mapped_column(Integer, nullable=False, server_default=text("0"))
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    finished_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class Message(Base):
    """The task's initial transcript (its goal), in OpenAI chat format, written at creation
    (`seq` dense per task); what the steps append is on their history rows (`Event`)."""

    __tablename__ = "messages"

    task_id: Mapped[str] = mapped_column(String(36), primary_key=True)
    seq: Mapped[int] = mapped_column(Integer, primary_key=True)
    role: Mapped[str] = mapped_column(String(16), nullable=False)
    content: Mapped[Any] = mapped_column(JSONType)  # str, or a list of content parts
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    tool_call_id: Mapped[str | None] = mapped_column(String(128))
    step_index: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)


class Attachment(Base):
    """An uploaded file; images are preprocessed into a content-addressed result."""

    __tablename__ = "attachments"

    id: Mapped[str] = mapped_column(String(36), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(128), nullable=False)
    task_id: Mapped[str | None] = mapped_column(String(36), ForeignKey("tasks.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16), nullable=False)  # PENDING | READY | FAILED
    media_type: Mapped[str] = mapped_column(String(128), nullable=False)
    filename: Mapped[str | None] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column(Integer, nullable=False)
    sha256: Mapped[str] = mapped_column(String(64), nullable=False)  # blob of the original bytes
    content_hash: Mapped[str | None] = mapped_column(String(64))  # decoded pixels + settings
    processed_sha256: Mapped[str | None] = mapped_column(String(64))
    grid_thw: Mapped[list[list[int]] | None] = mapped_column(JSONType)
    redaction: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)

    __table_args__ = (Index("ix_attachments_task", "task_id"),)


class Event(Base):
    """The task's history: the transactional outbox (every state change, in order per task:
    `seq`), with the outcome of the step an event finishes and the message it appended."""

    __tablename__ = "events"

    id: Mapped[int] = mapped_column(BigIntId, primary_key=True, autoincrement=True)
    task_id: Mapped[str] = mapped_column(String(36), nullable=False)
    seq: Mapped[int] = mapped_column(BigInteger, nullable=False)
    type: Mapped[str | None] = mapped_column(String(64))  # NULL: a migrated row, no event
    payload: Mapped[dict[str, Any] | None] = mapped_column(JSONText)  # json, not jsonb: see types
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    # The step this row finishes (its finish time is `created_at`) and its last attempt; the
    # successful attempt's `runner_id`, `resumed`, `usage`, `started_at`; a failure's `error`.
    # (In this order: the fixed-width columns first, so that the row needs no alignment padding.)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    step_index: Mapped[int | None] = mapped_column(Integer)
    attempt: Mapped[int | None] = mapped_column(Integer)
    resumed: Mapped[int | None] = mapped_column(Integer)
    step_status: Mapped[str | None] = mapped_column(String(16))
    runner_id: Mapped[str | None] = mapped_column(String(64))
    usage: Mapped[dict[str, Any] | None] = mapped_column(JSONText)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    # The transcript message the step appended (NULL `role`: none).
    role: Mapped[str | None] = mapped_column(String(16))
    content: Mapped[Any] = mapped_column(JSONType, nullable=True)  # str, or content parts
    tool_calls: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    tool_call_id: Mapped[str | None] = mapped_column(String(128))

    # AUTOINCREMENT: SQLite never hands an id out twice (the relay's cursor needs that).
    __table_args__ = (
        UniqueConstraint("task_id", "seq", name="uq_events_task_seq"),
        {"sqlite_autoincrement": True},
    )


class RelayCursor(Base):
    """The outbox relay's position: every event with an id below `low_water` is published."""

    __tablename__ = "relay_cursors"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    low_water: Mapped[int] = mapped_column(BigInteger, nullable=False)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)


class ApiKey(Base):
    """An API key, stored hashed, mapping to a tenant. The secret is shown once, at creation.

    Keys are 256-bit random secrets, so a plain SHA-256 of the secret is enough (a slow password
    hash protects guessable secrets; these are not guessable) and keeps auth off the latency path.
    """

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(16), primary_key=True)  # public prefix of the key
    tenant: Mapped[str] = mapped_column(String(128), nullable=False)
    key_hash: Mapped[str] = mapped_column(String(64), nullable=False)
    name: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, nullable=False)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_api_keys_tenant", "tenant"),)

"""A `TaskCreate` body becomes a task: attachments checked and stored, then `create_tasks`.

Shared by REST (`POST /v1/tasks`) and Kafka ingest; `dayzero run` builds a `NewTask` directly.
"""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, select

from core.media import SNIFF_BYTES, sniff_media_type
from orchestrator.config import Budgets
from orchestrator.db.tables import attachments_t
from orchestrator.tasks.attachments import NewAttachment, add_attachments, put_blob
from orchestrator.tasks.create import NewTask, create_tasks, existing_tasks, replay_of
from orchestrator.tasks.errors import IdempotencyConflict
from orchestrator.tasks.schemas import (
    ATTACHMENT_MEDIA_TYPES,
    ATTACHMENT_URL_PREFIX,
    INLINE_IMAGE_PREFIX,
    InlineAttachment,
    TaskCreate,
    UploadedAttachment,
    unknown_tools_problem,
)

_INLINE_NS = uuid.UUID("6f6c2b2e-4d0a-4c3e-9a55-0d1f3f0c6a21")


class InvalidSubmission(ValueError):
    """The body is well-formed but cannot become a task (e.g. an unknown attachment)."""

    def __init__(self, reason: str, detail: str, status: int = 422):
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        self.status = status  # REST: 404 unknown upload, 409 upload already used, else 422


@dataclass(frozen=True, slots=True)
class _Inline:
    id: str
    sha256: str
    data: bytes
    media_type: str
    filename: str | None


def check_allowed_tools(body: TaskCreate, known_tools: Collection[str]) -> None:
    """Raise `InvalidSubmission("invalid_task")` when `allowed_tools` names a tool outside
    `known_tools` (`Settings.known_tools()`): the one check REST and Kafka both run."""
    problem = unknown_tools_problem(body.allowed_tools, known_tools)
    if problem is not None:
        raise InvalidSubmission("invalid_task", problem)


def to_new_task(
    body: TaskCreate,
    tenant: str,
    *,
    idempotency_key: str | None,
    attachment_ids: list[str],
    traceparent: str | None = None,
) -> NewTask:
    return NewTask(
        tenant=tenant,
        goal=body.goal,
        messages=[
            _with_attachment_ids(m.model_dump(exclude_none=True), attachment_ids) for m in body.messages
        ],
        system_prompt=body.system_prompt,
        allowed_tools=body.allowed_tools,
        sampling=body.sampling.model_dump(exclude_none=True) if body.sampling else None,
        metadata=body.metadata or None,
        max_steps=body.budget.max_steps,
        max_tokens=body.budget.max_tokens,
        deadline_s=body.budget.deadline_s,
        max_context_tokens=body.budget.max_context_tokens,
        context_policy=body.budget.context_policy,
        idempotency_key=idempotency_key,
        attachment_ids=attachment_ids,
        traceparent=traceparent,
    )


def _with_attachment_ids(message: dict[str, Any], attachment_ids: list[str]) -> dict[str, Any]:
    """An image part the schema turned into attachment number i now names that attachment."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        url = part.get("image_url", {}).get("url", "") if isinstance(part, dict) else ""
        if isinstance(url, str) and url.startswith(INLINE_IMAGE_PREFIX):
            att_id = attachment_ids[int(url[len(INLINE_IMAGE_PREFIX) :])]
            part = {**part, "image_url": {"url": ATTACHMENT_URL_PREFIX + att_id}}
        parts.append(part)
    return {**message, "content": parts}


def _decode_inline(body: TaskCreate, tenant: str, idempotency_key: str | None) -> dict[int, _Inline]:
    import hashlib

    out: dict[int, _Inline] = {}
    for i, a in enumerate(body.attachments):
        if not isinstance(a, InlineAttachment):
            continue
        try:
            data = base64.b64decode(a.data, validate=False)
        except (binascii.Error, ValueError) as exc:
            raise InvalidSubmission("bad_attachment", f"attachments[{i}].data is not base64: {exc}") from None
        if not data:
            raise InvalidSubmission("bad_attachment", f"attachments[{i}].data is empty")
        # The content decides when it shows an accepted type (as for uploads); content that shows
        # none keeps its declared type and fails in the preprocess worker's decode, typed.
        found = sniff_media_type(data[:SNIFF_BYTES])
        media_type = found if found in ATTACHMENT_MEDIA_TYPES else a.media_type
        sha = hashlib.sha256(data).hexdigest()
        # With an idempotency key the id is derived, so a replay hashes to the same request.
        att_id = (
            str(uuid.uuid5(_INLINE_NS, f"{tenant}\0{idempotency_key}\0{i}\0{sha}"))
            if idempotency_key is not None
            else str(uuid.uuid4())
        )
        out[i] = _Inline(att_id, sha, data, media_type, a.filename)
    return out


def submit_task(
    conn: Connection,
    body: TaskCreate,
    tenant: str,
    budgets: Budgets,
    blob_dir: str,
    *,
    idempotency_key: str | None = None,
    traceparent: str | None = None,
    inserted: dict[str, dict[str, Any]] | None = None,
) -> tuple[str, bool]:
    """Create the task (or find the one this idempotency key made). Never commits.

    `inserted` receives the new task row, so the caller need not read it back. Raises
    `IdempotencyConflict` (same key, different body) and `InvalidSubmission`.
    """
    inline = _decode_inline(body, tenant, idempotency_key)
    att_ids = [
        inline[i].id if i in inline else a.upload_id  # type: ignore[union-attr]
        for i, a in enumerate(body.attachments)
    ]
    spec = to_new_task(
        body, tenant, idempotency_key=idempotency_key, attachment_ids=att_ids, traceparent=traceparent
    )
    # Looked up once, before touching attachments: on a replay they already belong to the task.
    known = existing_tasks(conn, [spec])
    out = replay_of(known, spec)
    if out is None:
        _store_attachments(conn, body, tenant, blob_dir, inline)
        (out,) = create_tasks(conn, [spec], budgets, known=known, inserted=inserted)
    if isinstance(out, IdempotencyConflict):
        raise out
    return out


def _store_attachments(
    conn: Connection, body: TaskCreate, tenant: str, blob_dir: str, inline: dict[int, _Inline]
) -> None:
    """Check the referenced uploads are this tenant's and unused; store the inline ones."""
    uploaded = [a.upload_id for a in body.attachments if isinstance(a, UploadedAttachment)]
    if uploaded:
        rows = conn.execute(
            select(attachments_t.c.id, attachments_t.c.task_id, attachments_t.c.status).where(
                attachments_t.c.id.in_(uploaded), attachments_t.c.tenant == tenant
            )
        ).all()
        found = {r.id: r for r in rows}
        missing = [u for u in uploaded if u not in found]
        if missing:  # someone else's upload is indistinguishable from a missing one
            raise InvalidSubmission("unknown_attachment", f"no such attachment(s): {missing}", 404)
        if len(set(uploaded)) != len(uploaded):
            raise InvalidSubmission("attachment_in_use", "an attachment is listed twice", 409)
        used = [r.id for r in rows if r.task_id is not None or r.status == "FAILED"]
        if used:
            raise InvalidSubmission("attachment_in_use", f"attachment(s) already used or failed: {used}", 409)
    if inline:
        for a in inline.values():
            put_blob(blob_dir, a.data)
        add_attachments(
            conn,
            [
                NewAttachment(a.id, tenant, a.media_type, a.filename, len(a.data), a.sha256)
                for a in inline.values()
            ],
        )

"""Attachment rows: the one place they are created, for REST uploads and for the inline
attachments of a submission (REST or Kafka). Their bytes go to the content-addressed blob store
(`preprocess.store.BlobStore` under `settings.blob_dir`, any fsspec URL) that the preprocess
workers read from, before the row that names them is written."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, insert

from orchestrator.clock import utcnow
from orchestrator.db.tables import attachments_t
from preprocess.store import BlobStore


@dataclass(frozen=True, slots=True)
class NewAttachment:
    """An attachment whose bytes are stored (`sha256`), not yet used by a task."""

    id: str
    tenant: str
    media_type: str  # decided by the content (`core.media.sniff_media_type`)
    filename: str | None
    size_bytes: int
    sha256: str


def put_blob(blob_dir: str, data: bytes) -> str:
    """Store `data` under its SHA-256 (a no-op if present); returns the digest."""
    return BlobStore(blob_dir).put(data)


def add_attachments(conn: Connection, new: Sequence[NewAttachment]) -> list[dict[str, Any]]:
    """Insert `PENDING` rows for `new` (in the caller's transaction); returns the rows written."""
    now = utcnow()
    rows = [
        {
            "id": a.id,
            "tenant": a.tenant,
            "status": "PENDING",
            "media_type": a.media_type,
            "filename": a.filename,
            "size_bytes": a.size_bytes,
            "sha256": a.sha256,
            "created_at": now,
            "updated_at": now,
        }
        for a in new
    ]
    if rows:
        conn.execute(insert(attachments_t), rows)
    return rows

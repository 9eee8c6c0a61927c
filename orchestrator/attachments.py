"""Attachments: store the bytes content-addressed, record the row, and resolve them for the model.

Images are preprocessed by the runner's PREPROCESSING stage (on the `preprocess` queue); other
files (text) are usable as they are.
"""

from __future__ import annotations

import base64
import mimetypes
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert

from orchestrator.clock import utcnow
from orchestrator.config import Settings
from orchestrator.store import attachments_t

ATTACHMENT_URL_PREFIX = "dayzero://attachments/"


def blob_store(blob_url: str) -> Any:
    from preprocess.store import BlobStore  # light import; fsspec only

    return BlobStore(blob_url)


def local_blob_path(blob_url: str, sha256: str) -> str | None:
    """The file holding a blob when the store is a local directory (tools read it), else None."""
    store = blob_store(blob_url)
    return store._blob_path(sha256) if store._local else None


def add_attachment(
    conn: Connection, blob_url: str, tenant: str, data: bytes, media_type: str, filename: str | None = None
) -> str:
    """Store `data` and insert a PENDING attachment row; returns its id."""
    sha = blob_store(blob_url).put(data)
    att_id = str(uuid.uuid4())
    now = utcnow()
    conn.execute(
        insert(attachments_t).values(
            id=att_id,
            tenant=tenant,
            status="PENDING",
            media_type=media_type,
            filename=filename,
            size_bytes=len(data),
            sha256=sha,
            created_at=now,
            updated_at=now,
        )
    )
    return att_id


def attach_files(conn: Connection, settings: Settings, tenant: str, paths: Iterable[str]) -> list[str]:
    """Attach local files (the CLI's `--image`); the media type comes from the file name."""
    ids = []
    for p in paths:
        path = Path(p)
        media_type = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
        ids.append(add_attachment(conn, settings.blob_dir, tenant, path.read_bytes(), media_type, path.name))
    return ids


def resolve_images(
    messages: Sequence[Mapping[str, Any]], attachments: Sequence[Mapping[str, Any]], blob_url: str
) -> list[dict[str, Any]]:
    """Replace `dayzero://attachments/<id>` image URLs by data URLs of the original bytes, the form
    every OpenAI-compatible server accepts. Messages without such parts are passed through."""
    by_id = {a["id"]: a for a in attachments}
    out: list[dict[str, Any]] = []
    store = None
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(dict(m))
            continue
        parts = []
        for part in content:
            url = (part.get("image_url") or {}).get("url", "") if part.get("type") == "image_url" else ""
            if url.startswith(ATTACHMENT_URL_PREFIX):
                att = by_id.get(url[len(ATTACHMENT_URL_PREFIX) :])
                if att is None:
                    raise LookupError(f"message refers to attachment {url} that the task does not own")
                store = store or blob_store(blob_url)
                b64 = base64.b64encode(store.get(att["sha256"])).decode()
                part = {"type": "image_url", "image_url": {"url": f"data:{att['media_type']};base64,{b64}"}}
            parts.append(part)
        out.append({**m, "content": parts})
    return out

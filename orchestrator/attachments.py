"""Attachments: store the bytes content-addressed, record the row, and resolve them for the model.

Images are preprocessed by the runner's PREPROCESSING stage (on the `preprocess` queue); other
files (text) are usable as they are.

What a model request carries for an image attachment (`resolve_images`), one rule for every path:
- a server that shares the blob store (the embedded engine, our own server with
  DAYZERO_INFERENCE_IMAGES_BY_REFERENCE) gets a reference to the workers' processed result,
  `dayzero-processed:<processed_sha256>`, and feeds those very patches to its vision tower;
- any other server gets image bytes: the redacted image the workers stored when redaction is on
  (never the original), the original bytes when it is off.
Each image is followed by its label (`image_label`): the model sees the file name and the attachment
id that the image tools (`image_info`, `image_crop_zoom`) take.
A PDF becomes its text, page by page, with the page images (scans, figures) placed after their
page's text by the same rule (rendered pages: the model-size PNG, there is no original).
"""

from __future__ import annotations

import base64
import json
import mimetypes
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, insert

from orchestrator.clock import utcnow
from orchestrator.config import Settings
from orchestrator.db.tables import attachments_t
from orchestrator.tasks.schemas import ATTACHMENT_URL_PREFIX
from preprocess.config import PDF_MEDIA_TYPE  # stdlib only: no numpy, torch or OpenCV here

PROCESSED_URL_PREFIX = "dayzero-processed:"  # + processed_sha256; see inference.server.images


class AttachmentError(Exception):
    """An attachment cannot be put into a model request (not preprocessed, not the task's, ...)."""


def preprocess_config_for(
    base: Mapping[str, Any] | None, tenants: Mapping[str, Mapping[str, Any]] | None, tenant: str
) -> dict[str, Any]:
    """The `PreprocessConfig` fields for one tenant's attachments: the defaults, then its overrides."""
    return {**(base or {}), **((tenants or {}).get(tenant) or {})}


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
    messages: Sequence[Mapping[str, Any]],
    attachments: Sequence[Mapping[str, Any]],
    blob_url: str,
    *,
    by_reference: bool = False,
    texts: Callable[[str], str] | None = None,
) -> list[dict[str, Any]]:
    """Replace `dayzero://attachments/<id>` image parts by what the model server takes (see the
    module docstring). Messages without such parts are passed through. Raises `AttachmentError`.
    `texts`: the reader of a text blob by sha256 (a text file, a PDF's parsed pages); the runner's
    is its per-process cache (`runner.payloads.PayloadCache.text`), so that a document's text is
    read from the store once per runner process, however often its task is claimed."""
    by_id = {a["id"]: a for a in attachments}
    out: list[dict[str, Any]] = []
    store = None
    read_text = texts or (lambda sha: blob_store(blob_url).get(sha).decode("utf-8", errors="replace"))
    for m in messages:
        content = m.get("content")
        if not isinstance(content, list):
            out.append(dict(m))
            continue
        parts = []
        for part in content:
            url = (part.get("image_url") or {}).get("url", "") if part.get("type") == "image_url" else ""
            if not url.startswith(ATTACHMENT_URL_PREFIX):
                parts.append(part)
                continue
            att = by_id.get(url[len(ATTACHMENT_URL_PREFIX) :])
            if att is None:
                raise AttachmentError(f"message refers to attachment {url} that the task does not own")
            store = store or blob_store(blob_url)
            if att["media_type"] == PDF_MEDIA_TYPE:
                parts.extend(_document_parts(att, store, by_reference, read_text))
            elif att["media_type"].startswith("text/"):  # text files are read as they are
                text = read_text(att["sha256"])
                parts.append({"type": "text", "text": f"[file {att.get('filename') or att['id']}]\n{text}"})
            else:
                parts.append(_image_part(att, store, by_reference))
                parts.append({"type": "text", "text": image_label(att)})
        out.append({**m, "content": parts})
    return out


def image_label(att: Mapping[str, Any]) -> str:
    """The text after an image part naming its file and the id the image tools take."""
    return f"\n[image {att.get('filename') or att['id']}, attachment_id {att['id']}]\n"


def _document_parts(
    att: Mapping[str, Any], store: Any, by_reference: bool, read_text: Callable[[str], str]
) -> list[dict[str, Any]]:
    """A parsed PDF as content parts: its pages' text, each page's image right after its text."""
    if not att.get("processed_sha256"):
        raise AttachmentError(
            f"attachment {att['id']} has not been preprocessed (status {att.get('status')})"
        )
    manifest = json.loads(read_text(att["processed_sha256"]))
    images = {img["page"]: img for img in manifest["page_images"]}
    name = att.get("filename") or att["id"]
    parts: list[dict[str, Any]] = []
    text = [f"[document {name}: {len(manifest['pages'])} pages]"]
    for page in manifest["pages"]:
        text.append(f"\n[page {page['page'] + 1}]\n{page['text']}")
        img = images.get(page["page"])
        if img is not None:
            parts.append({"type": "text", "text": "".join(text)})
            text = []
            if by_reference:
                url = PROCESSED_URL_PREFIX + img["processed_sha256"]
            else:
                url = "data:image/png;base64," + base64.b64encode(store.get(img["image_sha256"])).decode()
            parts.append({"type": "image_url", "image_url": {"url": url}})
    text.append(f"\n[end of document {name}]")
    parts.append({"type": "text", "text": "".join(text)})
    return parts


def _image_part(att: Mapping[str, Any], store: Any, by_reference: bool) -> dict[str, Any]:
    if not att.get("processed_sha256"):
        raise AttachmentError(
            f"attachment {att['id']} has not been preprocessed (status {att.get('status')})"
        )
    if by_reference:
        url = PROCESSED_URL_PREFIX + att["processed_sha256"]
        return {"type": "image_url", "image_url": {"url": url}}
    redaction = att.get("redaction") or {}
    if redaction.get("enabled"):
        sha = redaction.get("image_sha256")
        if not sha:  # fail closed: with redaction on, the original never goes out
            raise AttachmentError(f"attachment {att['id']} is redacted but its redacted image is missing")
        media_type, data = "image/png", store.get(sha)
    else:
        media_type, data = att["media_type"], store.get(att["sha256"])
    b64 = base64.b64encode(data).decode()
    return {"type": "image_url", "image_url": {"url": f"data:{media_type};base64,{b64}"}}

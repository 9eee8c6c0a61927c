"""`/v1/attachments`: streamed image or PDF upload with a size limit; tenant-scoped reads."""

from __future__ import annotations

import uuid
from typing import Annotated

import anyio
from fastapi import APIRouter, Path, Query, Request
from sqlalchemy import select

from core.media import SNIFF_BYTES, sniff_media_type
from orchestrator.api.blobs import BlobWriter, TooLarge
from orchestrator.api.deps import DbDep, IngressDep, SettingsDep, TenantDep
from orchestrator.api.errors import ProblemError, problem_responses
from orchestrator.api.schemas import AttachmentOut
from orchestrator.api.views import attachment_out
from orchestrator.db.tables import attachments_t
from orchestrator.tasks.attachments import NewAttachment, add_attachments
from orchestrator.tasks.schemas import ATTACHMENT_MEDIA_TYPES, ID_PATTERN

router = APIRouter(prefix="/v1/attachments", tags=["attachments"])

_UPLOAD_BODY = {
    "required": True,
    "content": {mt: {"schema": {"type": "string", "format": "binary"}} for mt in ATTACHMENT_MEDIA_TYPES},
}


@router.post(
    "",
    status_code=201,
    response_model=AttachmentOut,
    summary="Upload an image or a PDF (raw bytes; Content-Type = its media type)",
    description="The body is streamed to storage; larger than the limit is 413. Reference the returned "
    '`id` as `{"upload_id": id}` in a task\'s `attachments`.',
    openapi_extra={"requestBody": _UPLOAD_BODY},
    responses=problem_responses(401, 413, 415, 422),
)
async def upload(
    request: Request,
    tenant: TenantDep,
    engine: DbDep,
    settings: SettingsDep,
    ingress: IngressDep,
    filename: Annotated[str | None, Query(max_length=255, pattern=r"^[^\x00-\x1f/\\]+$")] = None,
) -> AttachmentOut:
    media_type = (request.headers.get("content-type") or "").split(";")[0].strip().lower()
    if media_type not in ATTACHMENT_MEDIA_TYPES:
        raise ProblemError(
            415, "Unsupported Media Type", f"Content-Type must be one of {list(ATTACHMENT_MEDIA_TYPES)}"
        )
    limit = ingress.max_upload_bytes
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ProblemError(413, "Content Too Large", f"uploads are limited to {limit} bytes")
    writer = BlobWriter(settings.blob_dir, limit)
    head = b""
    try:
        async for chunk in request.stream():
            if len(head) < SNIFF_BYTES:
                head += chunk[: SNIFF_BYTES - len(head)]
            writer.write(chunk)
        if writer.size == 0:
            raise ProblemError(422, "Unprocessable Content", "empty upload", type_="validation-error")
        # The content decides (and is what gets recorded); the declared type only had to be one
        # we take.
        media_type = sniffed_type(head, media_type)
        digest = await anyio.to_thread.run_sync(writer.commit)
    except TooLarge:
        writer.discard()
        raise ProblemError(413, "Content Too Large", f"uploads are limited to {limit} bytes") from None
    except BaseException:
        writer.discard()
        raise
    new = NewAttachment(str(uuid.uuid4()), tenant, media_type, filename, writer.size, digest)

    def save() -> dict:
        with engine.begin() as conn:
            return add_attachments(conn, [new])[0]

    row = await anyio.to_thread.run_sync(save)
    return AttachmentOut(
        **{
            k: row[k]
            for k in ("id", "status", "media_type", "filename", "size_bytes", "sha256", "created_at")
        },
        task_id=None,
    )


def sniffed_type(head: bytes, declared: str) -> str:
    """The media type the bytes show; a 415 if they show none we take."""
    found = sniff_media_type(head)
    if found is None or found not in ATTACHMENT_MEDIA_TYPES:
        raise ProblemError(
            415,
            "Unsupported Media Type",
            f"declared {declared}, but the content is not one of {list(ATTACHMENT_MEDIA_TYPES)}",
        )
    return found


@router.get("/{attachment_id}", response_model=AttachmentOut, responses=problem_responses(401, 404, 422))
def get_attachment(
    attachment_id: Annotated[str, Path(pattern=ID_PATTERN)], tenant: TenantDep, engine: DbDep
) -> AttachmentOut:
    with engine.connect() as conn:
        row = conn.execute(
            select(attachments_t).where(attachments_t.c.id == attachment_id, attachments_t.c.tenant == tenant)
        ).first()
    if row is None:
        raise ProblemError(404, "Not Found", "no such attachment", type_="attachment-not-found")
    return attachment_out(row)

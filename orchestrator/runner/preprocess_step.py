"""The preprocess step: each pending image or PDF attachment through the dispatcher, one
transaction each, then the task becomes READY."""

from __future__ import annotations

import datetime as dt
from typing import TYPE_CHECKING

from core.payloads import PreprocessJob
from orchestrator.attachments import PDF_MEDIA_TYPE, preprocess_config_for
from orchestrator.db.tables import attachments_t
from orchestrator.metrics import PREPROCESS_JOBS
from orchestrator.retry import decide
from orchestrator.runner.txn import TaskView
from orchestrator.statemachine import TaskEvent
from orchestrator.tracing import current_traceparent, task_span, trace_error
from tools.base import ErrorKind
from workers.jobs import describe_error as describe_job_error

if TYPE_CHECKING:
    from orchestrator.runner.context import StepContext


def run_preprocess(r: StepContext, task: TaskView) -> bool:
    """Preprocess the task's pending image attachments, one transaction each; then READY.

    Returns False when the task was parked (a transient failure) or failed."""
    for att in task.attachments:
        if att["status"] != "PENDING":
            continue
        tx = r.txn(task)
        key = {"id": att["id"], "status": "PENDING"}
        if not (att["media_type"].startswith("image/") or att["media_type"] == PDF_MEDIA_TYPE):
            tx.update_row(attachments_t, key, status="READY", updated_at=tx.now)
            att["status"] = "READY"
            tx.commit(r.conn)
            continue
        attrs = {
            "dayzero.task_id": task.id,
            "dayzero.attachment_id": att["id"],
            "dayzero.media_type": att["media_type"],
        }
        with task_span(current_traceparent() or task.traceparent, "attachment.preprocess", attrs) as span:
            job = PreprocessJob(
                attachment_id=att["id"],
                blob_sha256=att["sha256"],
                blob_url=r.config.blob_url,
                media_type=att["media_type"],
                config=preprocess_config_for(r.config.preprocess, r.config.preprocess_tenants, att["tenant"]),
                traceparent=current_traceparent() or task.traceparent,  # the worker's parent
            )
            try:
                result = r.dispatcher.preprocess(job, r.config.preprocess_retry.timeout_s)
                error = None
            except Exception as exc:  # typed image errors and transport failures alike
                result, error = None, describe_job_error(exc)
                trace_error(span, error.get("type") or type(exc).__name__, str(exc))
            if result is not None:  # what was redacted is part of the trace, not only the row
                for field_name in ("enabled", "faces", "documents"):
                    value = (result.get("redaction") or {}).get(field_name)
                    if value is not None:
                        span.set_attribute(f"dayzero.redaction.{field_name}", value)
        PREPROCESS_JOBS.labels("ok" if error is None else "error").inc()
        tx = r.txn(task)
        if error is None:
            redaction = {**result["redaction"], "image_sha256": result.get("redacted_sha256")}
            tx.update_row(
                attachments_t,
                key,
                status="READY",
                content_hash=result["content_hash"],
                processed_sha256=result["processed_sha256"],
                grid_thw=result["grid_thw"],
                redaction=redaction,
                updated_at=tx.now,
            )
            summary = {k: redaction.get(k) for k in ("enabled", "faces", "documents")}
            ready = {"attachment": att["id"], "grid_thw": result["grid_thw"], "redaction": summary}
            if result.get("kind") == "document":
                ready.update(pages=result["pages"], page_images=result["page_images"])
            tx.event("attachment.ready", ready)
            att.update(
                status="READY",
                content_hash=result["content_hash"],
                processed_sha256=result["processed_sha256"],
                redaction=redaction,
            )
            tx.commit(r.conn)
            continue
        att["failures"] = att.get("failures", 0) + 1
        kind = ErrorKind.RETRYABLE if error.get("retryable") else ErrorKind.PERMANENT
        decision = decide(r.config.preprocess_retry, kind, att["failures"])  # idempotent job
        if decision.retry:
            tx.event("attachment.retry_scheduled", {"attachment": att["id"], "error": error})
            tx.set_task(
                next_run_at=tx.now + dt.timedelta(seconds=decision.delay_s),
                lease_owner=None,
                lease_until=None,
            )
            tx.commit(r.conn)
            return False
        tx.update_row(attachments_t, key, status="FAILED", error=error, updated_at=tx.now)
        tx.event("attachment.failed", {"attachment": att["id"], "error": error})
        tx.task_transition(TaskEvent.FAIL, error={"kind": "attachment", "attachment": att["id"], **error})
        tx.commit(r.conn)
        return False
    tx = r.txn(task)
    tx.task_transition(TaskEvent.PREPROCESSED)
    tx.commit(r.conn)
    return True

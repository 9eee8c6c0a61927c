"""What a model request carries for an image attachment, and where redaction settings come from."""

from __future__ import annotations

import base64

import pytest

from orchestrator.attachments import AttachmentError, preprocess_config_for, resolve_images
from orchestrator.config import PreprocessSettings, Settings
from preprocess import BlobStore

ORIGINAL = b"\x89PNG original bytes with a face"
REDACTED = b"\x89PNG redacted bytes"


@pytest.fixture
def store(tmp_path) -> BlobStore:
    return BlobStore(str(tmp_path / "blobs"))


def _att(store: BlobStore, *, redaction: dict | None, processed: bool = True) -> dict:
    return {
        "id": "a1",
        "media_type": "image/jpeg",
        "sha256": store.put(ORIGINAL),
        "processed_sha256": store.put(b"processed") if processed else None,
        "redaction": redaction,
        "status": "READY" if processed else "PENDING",
    }


def _messages() -> list[dict]:
    return [
        {"role": "system", "content": "be brief"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look"},
                {"type": "image_url", "image_url": {"url": "dayzero://attachments/a1"}},
            ],
        },
    ]


def _url(messages: list[dict]) -> str:
    return messages[1]["content"][1]["image_url"]["url"]


def test_by_reference_names_the_processed_blob(store):
    att = _att(store, redaction={"enabled": True, "image_sha256": store.put(REDACTED)})
    out = resolve_images(_messages(), [att], store.url, by_reference=True)
    assert _url(out) == f"dayzero-processed:{att['processed_sha256']}"
    assert out[0] == _messages()[0] and out[1]["content"][0] == {"type": "text", "text": "look"}


def test_bytes_are_the_redacted_image_when_redaction_is_on(store):
    att = _att(store, redaction={"enabled": True, "faces": 1, "image_sha256": store.put(REDACTED)})
    url = _url(resolve_images(_messages(), [att], store.url))
    assert url == "data:image/png;base64," + base64.b64encode(REDACTED).decode()


def test_redacted_image_missing_fails_closed(store):
    att = _att(store, redaction={"enabled": True, "faces": 1, "image_sha256": None})
    with pytest.raises(AttachmentError, match="redacted"):
        resolve_images(_messages(), [att], store.url)


def test_original_bytes_only_when_redaction_is_off(store):
    att = _att(store, redaction={"enabled": False, "image_sha256": None})
    url = _url(resolve_images(_messages(), [att], store.url))
    assert url == "data:image/jpeg;base64," + base64.b64encode(ORIGINAL).decode()


@pytest.mark.parametrize("by_reference", [True, False])
def test_unprocessed_or_foreign_attachments_are_refused(store, by_reference):
    with pytest.raises(AttachmentError, match="not been preprocessed"):
        resolve_images(
            _messages(), [_att(store, redaction=None, processed=False)], store.url, by_reference=by_reference
        )
    with pytest.raises(AttachmentError, match="does not own"):
        resolve_images(_messages(), [], store.url, by_reference=by_reference)


def test_preprocess_settings_from_the_environment(monkeypatch):
    monkeypatch.setenv("DAYZERO_PREPROCESS_REDACT_FACES", "true")
    monkeypatch.setenv(
        "DAYZERO_PREPROCESS_TENANTS", '{"acme": {"redact_documents": true, "redaction_mode": "black"}}'
    )
    settings = Settings()
    base = settings.preprocess.config()
    assert base == {
        "redact_faces": True,
        "redact_documents": False,
        "redaction_mode": "blur",
        "pdf_dpi": 100,
        "pdf_max_pages": 1000,
    }
    acme = preprocess_config_for(base, settings.preprocess.tenants, "acme")
    assert acme == {**base, "redact_documents": True, "redaction_mode": "black"}
    assert preprocess_config_for(base, settings.preprocess.tenants, "other") == base


def test_unknown_tenant_override_is_a_startup_error(monkeypatch):
    monkeypatch.setenv("DAYZERO_PREPROCESS_TENANTS", '{"acme": {"redact_face": true}}')
    with pytest.raises(ValueError, match="redact_face"):
        PreprocessSettings()


def test_make_runner_wires_redaction_from_settings(monkeypatch, tmp_path):
    from orchestrator.app import make_runner

    monkeypatch.setenv("DATABASE_URL", f"sqlite:///{tmp_path / 'db.sqlite'}")
    monkeypatch.setenv("DAYZERO_PREPROCESS_REDACT_DOCUMENTS", "1")
    monkeypatch.setenv("DAYZERO_PREPROCESS_TENANTS", '{"acme": {"redact_faces": true}}')
    monkeypatch.setenv("DAYZERO_INFERENCE_URL", "http://127.0.0.1:9")  # never called
    monkeypatch.setenv("DAYZERO_INFERENCE_IMAGES_BY_REFERENCE", "true")
    parts = make_runner(Settings(), upgrade=True)
    try:
        cfg = parts.runner.config
        assert cfg.preprocess["redact_documents"] is True and cfg.preprocess["redact_faces"] is False
        assert cfg.preprocess_tenants == {"acme": {"redact_faces": True}}
        assert parts.inference.images_by_reference is True
    finally:
        parts.close()


def test_text_attachments_are_read_as_text(store):
    att = {"id": "a1", "media_type": "text/plain", "sha256": store.put(b"hello notes"), "filename": "n.txt"}
    out = resolve_images(_messages(), [att], store.url)
    assert out[1]["content"][1] == {"type": "text", "text": "[file n.txt]\nhello notes"}


def test_encrypted_pdf_fails_the_task_with_a_typed_error(db, make_runner, tmp_path):
    import json

    from orchestrator.attachments import add_attachment
    from orchestrator.config import Budgets
    from orchestrator.store import NewTask, create_task, get_task
    from tests.preprocess.pdfs import Page, make_pdf

    blob_url = str(tmp_path / "blobs")
    with db.begin() as conn:
        att = add_attachment(
            conn, blob_url, "t1", make_pdf([Page(lines=["x"])], encrypted=True), "application/pdf"
        )
        task_id, _ = create_task(
            conn,
            NewTask(tenant="t1", goal="script:" + json.dumps({"cycles": 0}), attachment_ids=[att]),
            Budgets(),
        )
    make_runner(blob_url=blob_url).run_until_idle(timeout_s=60)
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert task.status == "FAILED"
    assert task.error["code"] == "document_encrypted" and task.error["retryable"] is False
    assert "decrypted" in task.error["message"]


def test_redaction_is_recorded_on_the_attachment_span(db, make_runner, tmp_path):
    import json
    from pathlib import Path

    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from orchestrator.attachments import add_attachment
    from orchestrator.config import Budgets
    from orchestrator.store import NewTask, create_task, get_task

    skimage_data = pytest.importorskip("skimage.data")
    photo = (Path(skimage_data.__file__).parent / "astronaut.png").read_bytes()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):  # OTel takes one provider per process: reuse it
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    blob_url = str(tmp_path / "blobs")
    with db.begin() as conn:
        att = add_attachment(conn, blob_url, "t1", photo, "image/png")
        task_id, _ = create_task(
            conn,
            NewTask(tenant="t1", goal="script:" + json.dumps({"cycles": 0}), attachment_ids=[att]),
            Budgets(),
        )
    runner = make_runner(blob_url=blob_url, preprocess={"redact_faces": True})
    runner.run_until_idle(timeout_s=60)
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
    # tools are handed the redacted image's file, never the original's
    (view,) = runner._load(task_id).attachments
    assert Path(view["path"]).read_bytes() == BlobStore(blob_url).get(view["redaction"]["image_sha256"])
    assert Path(view["path"]).read_bytes() != photo
    (span,) = [
        s
        for s in exporter.get_finished_spans()
        if s.name == "attachment.preprocess" and s.attributes.get("dayzero.attachment_id") == att
    ]  # the worker's own job span carries the attachment id too
    assert span.attributes["dayzero.task_id"] == task_id
    assert (
        span.attributes["dayzero.redaction.enabled"] is True
        and span.attributes["dayzero.redaction.faces"] == 1
    )

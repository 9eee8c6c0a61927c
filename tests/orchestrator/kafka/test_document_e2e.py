"""A long-document task through the message queue: a 120-page PDF generated here, sent inline in a
Kafka task message -> ingest -> the real Celery preprocess worker (parses it, renders the scanned
pages) -> runner -> the embedded engine. The page text is in the model's context; the page images go
by reference and are exactly the patches the worker stored."""

from __future__ import annotations

import base64
import json
import time

import torch

from orchestrator.dispatch import CeleryDispatcher
from orchestrator.embedded_client import EmbeddedChatClient
from orchestrator.kafka.producer import send_task
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import attachments_t, get_task, list_events
from preprocess import BlobStore, ProcessedImage
from tests.orchestrator.test_images_e2e import RecordingEngineClient, _vl_engine
from tests.orchestrator.test_task_pipeline import REDIS_URL, celery_worker  # noqa: F401  (fixture)
from tests.preprocess.pdfs import long_contract
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry

PAGES, SCANS = 120, (7, 88)


def test_long_pdf_through_kafka_worker_runner_and_engine(
    db,
    tenants,
    producer,
    kafka_settings,
    make_ingestor,
    celery_worker,  # noqa: F811  (the fixture imported above)
    tmp_path,
    monkeypatch,
):
    from inference.embedded import EmbeddedEngineClient

    monkeypatch.setenv("DAYZERO_TEST_STATE_DIR", str(tmp_path / "state"))
    pdf = long_contract(PAGES, scans=SCANS)
    body = {
        "goal": "Summarise the contract.",
        "attachments": [
            {
                "data": base64.b64encode(pdf).decode(),
                "media_type": "application/pdf",
                "filename": "contract.pdf",
            }
        ],
        "sampling": {"max_tokens": 2},
    }
    send_task(producer, "acme", body, idempotency_key="doc-1", topic=kafka_settings.tasks_topic).get(
        timeout=10
    )
    ing = make_ingestor(max_message_bytes=2 * 1024 * 1024)
    end = time.monotonic() + 30
    while ing.stats["created"] < 1 and time.monotonic() < end:
        ing.run_once()
    assert ing.stats["created"] == 1

    blob_url = str(tmp_path / "blobs")  # the ingestor's DAYZERO_BLOB_DIR
    engine, seen = _vl_engine()
    recorder = RecordingEngineClient(EmbeddedEngineClient(engine, blob_url=blob_url))
    client = EmbeddedChatClient(recorder, "m")
    dispatcher = CeleryDispatcher(REDIS_URL, REDIS_URL)
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    cfg = RunnerConfig(lease_s=30, poll_interval_s=0.05, blob_url=blob_url, preprocess={"pdf_dpi": 50})
    try:
        Runner(db, client, dispatcher, registry, cfg).run_until_idle(timeout_s=400)
    finally:
        dispatcher.close()
        client.close()
    with db.connect() as conn:
        (row,) = conn.execute(attachments_t.select()).all()
        task = get_task(conn, row.task_id)
        ready = next(e for e in list_events(conn, task.id) if e.type == "attachment.ready")
    assert task.status == "SUCCEEDED", task.error
    assert ready.payload["pages"] == PAGES and ready.payload["page_images"] == len(SCANS)

    (sent,) = recorder.bodies
    request = json.loads(sent)
    text = "".join(
        p.get("text", "") for m in request["messages"] if isinstance(m["content"], list) for p in m["content"]
    )
    for i in range(PAGES):  # every page's text is in the context, in order
        if i not in SCANS:
            assert f"marker-{i + 1:04d}" in text
    assert text.index("marker-0001") < text.index("marker-0060") < text.index(f"marker-{PAGES:04d}")
    manifest = json.loads(BlobStore(blob_url).get(row.processed_sha256))
    refs = [f"dayzero-processed:{img['processed_sha256']}" for img in manifest["page_images"]]
    assert [img["page"] for img in manifest["page_images"]] == list(SCANS)
    assert (
        all(ref in sent for ref in refs)
        and "data:" not in sent
        and base64.b64encode(pdf).decode()[:200] not in sent
    )

    # the tower got both scanned pages' patches, exactly as the worker stored them, in one call
    (pixels,) = seen
    stored = [
        ProcessedImage.from_bytes(BlobStore(blob_url).get(i["processed_sha256"]))
        for i in manifest["page_images"]
    ]
    assert torch.equal(pixels, torch.cat([torch.from_numpy(s.pixel_values.copy()) for s in stored]))
    assert task.prompt_tokens > len(text)  # the byte tokenizer: every character is in the prompt

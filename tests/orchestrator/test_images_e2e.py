"""One preprocessing, by reference: a face photo with redaction on goes through the real Celery
preprocess worker (Redis), the runner, and a model. Asserted on what the model receives:

* embedded engine and our HTTP server (`dayzero-processed:` references): the pixels the vision
  tower gets are exactly the worker's stored (redacted) patches;
* a third-party OpenAI-compatible server: the redacted image bytes;
and in every case the original bytes never appear in what the client sends.
"""

from __future__ import annotations

import base64
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from orchestrator.attachments import add_attachment
from orchestrator.config import Budgets
from orchestrator.dispatch import CeleryDispatcher
from orchestrator.embedded_client import EmbeddedChatClient
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import NewTask, attachments_t, create_task, get_task, list_events
from preprocess import BlobStore, PreprocessConfig, ProcessedImage, process_image
from tests.orchestrator.test_task_pipeline import REDIS_URL, celery_worker  # noqa: F401  (fixture)
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry

skimage_data = pytest.importorskip("skimage.data")  # a dev dependency: its bundled real photos
ASTRONAUT = (Path(skimage_data.__file__).parent / "astronaut.png").read_bytes()


class RecordingEngineClient:
    """The embedded engine client, keeping every request body the orchestrator sends it."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.bodies: list[str] = []

    @property
    def images_by_reference(self) -> bool:
        return self.inner.images_by_reference

    def chat(self, body, **kw):
        self.bodies.append(json.dumps(body))
        return self.inner.chat(body, **kw)

    def abort(self, request_id: str) -> None:
        self.inner.abort(request_id)

    def close(self) -> None:
        self.inner.close()


def _recording_http(client: OpenAIChatClient) -> list[str]:
    sent: list[str] = []
    client._http.event_hooks["request"].append(lambda req: sent.append(req.read().decode()))
    return sent


def _vl_engine():
    from inference.embedded import EMBEDDED_ENGINE_CONFIG
    from inference.engine.factory import build_engine, small_vl_model_config

    engine = build_engine(config=small_vl_model_config(), engine_config=EMBEDDED_ENGINE_CONFIG)
    seen: list[torch.Tensor] = []
    engine.runner.model.vision_tower.register_forward_pre_hook(
        lambda _mod, args: seen.append(args[0].detach().cpu().clone())
    )
    return engine, seen


def _face_patch_mask(image: ProcessedImage, boxes, p: int) -> np.ndarray:
    """True for patches that overlap a redaction box (boxes are in source pixels)."""
    _, gh, gw = image.grid_list()[0]
    sy = image.resized_size[0] / image.source_size[0]
    sx = image.resized_size[1] / image.source_size[1]
    mask = np.zeros((gh, gw), bool)
    for b in boxes:
        y0, y1 = int(b["y"] * sy) // p, int(np.ceil((b["y"] + b["h"]) * sy / p))
        x0, x1 = int(b["x"] * sx) // p, int(np.ceil((b["x"] + b["w"]) * sx / p))
        mask[y0:y1, x0:x1] = True
    return mask.reshape(-1)


@pytest.mark.parametrize("target", ["embedded", "http-ours", "http-third-party"])
def test_redacted_face_photo_reaches_the_model_as_the_worker_made_it(
    target,
    pg_url,
    model_server,
    celery_worker,  # noqa: F811  (the fixture imported above)
    tmp_path,
    monkeypatch,
):
    from inference.server.images import ImageSources
    from inference.server.serve import BackgroundServer
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    monkeypatch.setenv("DAYZERO_TEST_STATE_DIR", str(tmp_path / "state"))
    db = make_engine(pg_url)
    migrate.upgrade(db)
    blob_url = str(tmp_path / "blobs")
    server = None
    seen: list[torch.Tensor] = []
    if target == "embedded":
        from inference.embedded import EmbeddedEngineClient

        engine, seen = _vl_engine()
        recorder = RecordingEngineClient(EmbeddedEngineClient(engine, blob_url=blob_url))
        client = EmbeddedChatClient(recorder, "m")
        sent = recorder.bodies
    elif target == "http-ours":
        engine, seen = _vl_engine()
        server = BackgroundServer(engine, model_name="m", images=ImageSources(blob_url=blob_url)).__enter__()
        client = OpenAIChatClient(server.url, "m", images_by_reference=True)
        sent = _recording_http(client)
    else:
        client = OpenAIChatClient(model_server.url, "scripted")  # stands in for vLLM & co.
        sent = _recording_http(client)
    goal = 'script:{"cycles": 0}'
    with db.begin() as conn:
        att_id = add_attachment(conn, blob_url, "acme", ASTRONAUT, "image/png", "astronaut.png")
        task_id, _ = create_task(
            conn,
            NewTask(tenant="acme", goal=goal, attachment_ids=[att_id], sampling={"max_tokens": 2}),
            Budgets(),
        )
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    dispatcher = CeleryDispatcher(REDIS_URL, REDIS_URL)
    # Redaction is switched on for this tenant only, through the runner's configuration.
    cfg = RunnerConfig(
        lease_s=10,
        poll_interval_s=0.05,
        blob_url=blob_url,
        preprocess_tenants={"acme": {"redact_faces": True}},
    )
    runner = Runner(db, client, dispatcher, registry, cfg)
    try:
        runner.run_until_idle(timeout_s=240)
    finally:
        dispatcher.close()
        client.close()
        if server is not None:
            server.__exit__(None, None, None)
    with db.connect() as conn:
        task = get_task(conn, task_id)
        (row,) = conn.execute(attachments_t.select().where(attachments_t.c.id == att_id)).all()
        ready = next(e for e in list_events(conn, task_id) if e.type == "attachment.ready")
    db.dispose()
    assert task.status == "SUCCEEDED", task.error
    # Recorded on the attachment (and its event): what was redacted, and the redacted image's blob.
    assert row.redaction["enabled"] is True and row.redaction["faces"] == 1, row.redaction
    assert row.redaction["image_sha256"] and ready.payload["redaction"]["faces"] == 1
    store = BlobStore(blob_url)
    worker_out = ProcessedImage.from_bytes(store.get(row.processed_sha256))
    redacted_cfg = PreprocessConfig(redact_faces=True)
    assert worker_out.content_hash == row.content_hash
    assert worker_out.content_hash == process_image(ASTRONAUT, redacted_cfg).content_hash

    original_b64 = base64.b64encode(ASTRONAUT).decode()
    assert sent, "the model was never called"
    for body in sent:  # whatever the path, the original bytes never leave
        assert original_b64[1000:3000] not in body
    if target == "http-third-party":
        (url,) = {
            part["image_url"]["url"]
            for m in json.loads(sent[0])["messages"]
            if isinstance(m.get("content"), list)
            for part in m["content"]
            if part.get("type") == "image_url"
        }
        assert url.startswith("data:image/png;base64,")
        png = base64.b64decode(url.split(",", 1)[1])
        assert png == store.get(row.redaction["image_sha256"])
        got = np.asarray(Image.open(io.BytesIO(png)).convert("RGB"))
        original = np.asarray(Image.open(io.BytesIO(ASTRONAUT)).convert("RGB"))
        box = row.redaction["boxes"][0]
        face = (slice(box["y"], box["y"] + box["h"]), slice(box["x"], box["x"] + box["w"]))
        assert np.abs(got[face].astype(int) - original[face]).mean() > 10  # the face is blurred
        outside = np.ones(original.shape[:2], bool)
        outside[face] = False
        assert np.array_equal(got[outside], original[outside])  # and nothing else changed
        # and a server that preprocesses those bytes sees the worker's pixels
        again = process_image(png, PreprocessConfig())
        assert np.array_equal(again.pixel_values, worker_out.pixel_values)
        return
    assert all(f"dayzero-processed:{row.processed_sha256}" in body for body in sent)
    assert all("data:" not in body for body in sent)
    assert len(seen) == 1  # one tower call: the worker's patches, no second preprocessing
    assert torch.equal(seen[0], torch.from_numpy(worker_out.pixel_values.copy()))
    plain = process_image(ASTRONAUT, PreprocessConfig()).pixel_values
    face = _face_patch_mask(worker_out, row.redaction["boxes"], 14)
    assert face.any() and not face.all()
    assert not np.array_equal(seen[0].numpy()[face], plain[face])  # the tower never saw the face
    assert np.array_equal(seen[0].numpy()[~face], plain[~face])

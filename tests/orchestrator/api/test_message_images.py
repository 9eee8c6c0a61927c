"""Image parts inside a task's `messages` (issue 39, item 12): a `data:` image takes the
attachments' path (stored, preprocessed and redacted by the workers; the part refers to the
attachment), and user input can neither name a processed blob (`dayzero-processed:`) nor make
the model fetch a URL."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from sqlalchemy import select

from orchestrator.db.tables import attachments_t
from orchestrator.store import get_task, list_messages
from tests.orchestrator.api.conftest import Api


def _png() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (200, 30, 30)).save(buf, "PNG")
    return buf.getvalue()


def _body(url: str) -> dict:
    return {
        "goal": "what is in the picture?",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, {"type": "image_url", "image_url": {"url": url}}]}],
    }  # fmt: skip


def test_a_data_image_in_messages_becomes_an_attachment(api: Api):
    # Before: the data: URL was stored in the transcript and reached the model unprocessed and
    # unredacted.
    data_url = "data:image/png;base64," + base64.b64encode(_png()).decode()
    r = api.client.post("/v1/tasks", json=_body(data_url), headers=api.h())
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    with api.engine.connect() as conn:
        task = get_task(conn, task_id)
        atts = conn.execute(select(attachments_t).where(attachments_t.c.task_id == task_id)).all()
        messages = list_messages(conn, task_id)
    assert task.status == "PREPROCESSING"  # the workers see the image first
    assert [(a.media_type, a.tenant) for a in atts] == [("image/png", "acme")]
    assert "base64" not in str(messages)
    assert f"dayzero://attachments/{atts[0].id}" in str(messages)


@pytest.mark.parametrize(
    "url",
    [
        "dayzero-processed:" + "a" * 64,
        "http://169.254.169.254/latest/meta-data/x.png",
        "https://example.com/x.png",
    ],
    ids=["processed-reference", "metadata-url", "remote-url"],
)
def test_image_urls_and_processed_references_in_messages_are_refused(api: Api, url: str):
    # Before: a `dayzero-processed:<sha256>` URL made a by-reference server read any processed blob.
    r = api.client.post("/v1/tasks", json=_body(url), headers=api.h())
    assert r.status_code == 422, r.text
    assert any(e["type"] == "image_url_not_allowed" for e in r.json()["errors"])


def _jpeg() -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (40, 30), (30, 200, 30)).save(buf, "JPEG")
    return buf.getvalue()


def test_the_content_decides_the_media_type_and_is_recorded(api: Api):
    # Before: an upload declared image/png that was a JPEG was recorded as image/png.
    r = api.client.post("/v1/attachments", content=_jpeg(), headers=api.h(**{"content-type": "image/png"}))
    assert r.status_code == 201 and r.json()["media_type"] == "image/jpeg", r.text
    junk = api.client.post(
        "/v1/attachments", content=b"not an image at all", headers=api.h(**{"content-type": "image/png"})
    )
    assert junk.status_code == 415, junk.text
    inline = {
        "goal": "g",
        "attachments": [{"data": base64.b64encode(_jpeg()).decode(), "media_type": "image/png"}],
    }
    r = api.client.post("/v1/tasks", json=inline, headers=api.h())
    assert r.status_code == 201, r.text
    with api.engine.connect() as conn:
        (att,) = conn.execute(select(attachments_t).where(attachments_t.c.task_id == r.json()["id"])).all()
    assert att.media_type == "image/jpeg"

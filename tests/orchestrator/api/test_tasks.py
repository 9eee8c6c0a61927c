"""REST: submit, get, list, cancel, idempotency, limits, problem+json — on SQLite and PostgreSQL."""

from __future__ import annotations

import base64
import datetime as dt

from orchestrator.store import get_task, list_messages
from preprocess.store import BlobStore
from tests.orchestrator.api.conftest import Api

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="
)


def _problem(resp, status: int) -> dict:
    assert resp.status_code == status, resp.text
    assert resp.headers["content-type"].startswith("application/problem+json")
    body = resp.json()
    assert body["status"] == status and body["title"]
    return body


def test_submit_get_and_transcript(api: Api):
    body = {
        "goal": "summarise the report",
        "system_prompt": "be brief",
        "messages": [{"role": "user", "content": "context"}],
        "allowed_tools": ["echo"],
        "budget": {"max_steps": 5, "deadline_s": 60},
        "sampling": {"temperature": 0.2},
        "metadata": {"team": "research", "n": 3},
    }
    r = api.client.post("/v1/tasks", json=body, headers=api.h())
    assert r.status_code == 201, r.text
    task = r.json()
    assert r.headers["location"] == f"/v1/tasks/{task['id']}"
    assert task["status"] == "READY" and task["limits"]["max_steps"] == 5
    assert task["metadata"] == {"team": "research", "n": 3}
    got = api.client.get(f"/v1/tasks/{task['id']}", headers=api.h()).json()
    assert got["id"] == task["id"] and got["steps"] == [] and got["usage"]["steps"] == 0
    with api.engine.connect() as conn:
        row = get_task(conn, task["id"], "acme")
        msgs = list_messages(conn, task["id"])
    assert row.sampling == {"temperature": 0.2} and row.allowed_tools == ["echo"]
    assert [m["role"] for m in msgs] == ["system", "user", "user"]
    assert msgs[-1]["content"] == "summarise the report"


def test_idempotency_key_same_body_same_task_different_body_409(api: Api):
    h = api.h(**{"Idempotency-Key": "order-42"})
    first = api.client.post("/v1/tasks", json={"goal": "a"}, headers=h)
    again = api.client.post("/v1/tasks", json={"goal": "a"}, headers=h)
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["id"] == again.json()["id"]
    body = _problem(api.client.post("/v1/tasks", json={"goal": "b"}, headers=h), 409)
    assert "idempotency" in body["type"]
    # the same key in another tenant is a different task
    other = api.client.post(
        "/v1/tasks", json={"goal": "a"}, headers=api.h("globex", **{"Idempotency-Key": "order-42"})
    )
    assert other.status_code == 201 and other.json()["id"] != first.json()["id"]


def test_validation_errors_are_problem_json(api: Api):
    b = _problem(api.client.post("/v1/tasks", json={"goal": ""}, headers=api.h()), 422)
    assert b["errors"] and b["errors"][0]["loc"][:2] == ["body", "goal"]
    _problem(api.client.post("/v1/tasks", json={"goal": "x", "bogus": 1}, headers=api.h()), 422)
    _problem(api.client.post("/v1/tasks", json={"goal": "x" * 32_001}, headers=api.h()), 422)
    msgs = [{"role": "user", "content": "m"}] * 257
    _problem(api.client.post("/v1/tasks", json={"goal": "x", "messages": msgs}, headers=api.h()), 422)
    _problem(
        api.client.post(
            "/v1/tasks", content=b"{not json", headers=api.h(**{"content-type": "application/json"})
        ),
        422,
    )
    _problem(api.client.get("/v1/tasks?limit=0", headers=api.h()), 422)
    _problem(api.client.get("/v1/tasks?cursor=zzz", headers=api.h()), 422)


def test_body_size_limit_is_413(api: Api):
    big = {
        "goal": "x",
        "metadata": {"pad": "y" * 1000},
        "messages": [{"role": "user", "content": "z" * 30_000}] * 3,
    }
    _problem(api.client.post("/v1/tasks", json=big, headers=api.h()), 413)

    def chunks():  # no Content-Length: the streamed count trips the limit
        for _ in range(100):
            yield b" " * 1024

    _problem(
        api.client.post("/v1/tasks", content=chunks(), headers=api.h(**{"content-type": "application/json"})),
        413,
    )


def test_auth_required(api: Api):
    _problem(api.client.get("/v1/tasks"), 401)
    _problem(api.client.get("/v1/tasks", headers={"Authorization": "Bearer dz_nope_nope"}), 401)
    assert api.client.get("/v1/tasks", headers={"X-API-Key": api.keys["acme"]}).status_code == 200


def test_list_filters_and_cursor_pagination(api: Api):
    ids = []
    for i in range(7):
        r = api.client.post(
            "/v1/tasks",
            json={"goal": f"g{i}", "metadata": {"batch": "b1" if i % 2 else "b2"}},
            headers=api.h(),
        )
        ids.append(r.json()["id"])
    api.client.post("/v1/tasks", json={"goal": "other tenant"}, headers=api.h("globex"))
    api.client.post(f"/v1/tasks/{ids[0]}/cancel", headers=api.h())
    seen, cursor = [], None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = api.client.get("/v1/tasks", params=params, headers=api.h()).json()
        seen += [t["id"] for t in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(seen) == sorted(ids) and len(seen) == 7
    assert seen == sorted(seen, key=lambda i: ids.index(i), reverse=True)
    b1 = api.client.get("/v1/tasks", params={"metadata": "batch=b1"}, headers=api.h()).json()["items"]
    assert sorted(t["id"] for t in b1) == sorted(ids[1::2])
    cancelled = api.client.get("/v1/tasks", params={"status": "CANCELLED"}, headers=api.h()).json()["items"]
    assert [t["id"] for t in cancelled] == [ids[0]]
    both = api.client.get("/v1/tasks", params=[("status", "CANCELLED"), ("status", "READY")], headers=api.h())
    assert len(both.json()["items"]) == 7
    future = (dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)).isoformat()
    assert (
        api.client.get("/v1/tasks", params={"created_after": future}, headers=api.h()).json()["items"] == []
    )
    assert (
        len(api.client.get("/v1/tasks", params={"created_before": future}, headers=api.h()).json()["items"])
        == 7
    )


def test_cancel(api: Api):
    tid = api.client.post("/v1/tasks", json={"goal": "x"}, headers=api.h()).json()["id"]
    r = api.client.post(f"/v1/tasks/{tid}/cancel", headers=api.h())
    assert r.status_code == 202 and r.json()["status"] == "CANCELLED"
    again = api.client.post(f"/v1/tasks/{tid}/cancel", headers=api.h())  # too late: it ended
    assert "CANCELLED" in _problem(again, 409)["detail"]
    _problem(api.client.post("/v1/tasks/does-not-exist/cancel", headers=api.h()), 404)


def test_upload_then_reference_and_inline_attachment(api: Api, tmp_path):
    up = api.client.post(
        "/v1/attachments",
        content=PNG,
        params={"filename": "dot.png"},
        headers=api.h(**{"content-type": "image/png"}),
    )
    assert up.status_code == 201, up.text
    att = up.json()
    assert att["size_bytes"] == len(PNG) and att["status"] == "PENDING"
    assert BlobStore(api.settings.blob_dir).get(att["sha256"]) == PNG
    body = {
        "goal": "look",
        "attachments": [
            {"upload_id": att["id"]},
            {"data": base64.b64encode(PNG).decode(), "media_type": "image/png"},
        ],
    }
    h = api.h(**{"Idempotency-Key": "with-images"})
    r = api.client.post("/v1/tasks", json=body, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["status"] == "PREPROCESSING"
    replay = api.client.post("/v1/tasks", json=body, headers=h)
    assert replay.status_code == 200 and replay.json()["id"] == r.json()["id"]
    assert api.client.get(f"/v1/attachments/{att['id']}", headers=api.h()).json()["task_id"] == r.json()["id"]
    # an upload can be used once (409); an unknown id is 404
    _problem(
        api.client.post(
            "/v1/tasks", json={"goal": "again", "attachments": [{"upload_id": att["id"]}]}, headers=api.h()
        ),
        409,
    )
    _problem(
        api.client.post(
            "/v1/tasks", json={"goal": "x", "attachments": [{"upload_id": "nope"}]}, headers=api.h()
        ),
        404,
    )


def test_upload_limits(api: Api):
    _problem(
        api.client.post(
            "/v1/attachments", content=b"x" * 40_000, headers=api.h(**{"content-type": "image/png"})
        ),
        413,
    )

    def chunks():
        for _ in range(40):
            yield b"x" * 1024

    _problem(
        api.client.post("/v1/attachments", content=chunks(), headers=api.h(**{"content-type": "image/png"})),
        413,
    )
    _problem(
        api.client.post("/v1/attachments", content=b"abc", headers=api.h(**{"content-type": "text/plain"})),
        415,
    )


def test_health_ready_metrics(api: Api):
    assert api.client.get("/healthz").json() == {"status": "ok"}
    ready = api.client.get("/readyz").json()
    from orchestrator.db import migrate

    assert ready["status"] == "ready" and ready["revision"] == migrate.head_revision() == "0013"
    api.client.post("/v1/tasks", json={"goal": "x"}, headers=api.h())
    text = api.client.get("/metrics").text
    assert 'dayzero_http_requests_total{method="POST",route="/v1/tasks",status="201"}' in text
    assert "dayzero_tasks_submitted_total" in text


def test_trace_context_from_the_request_is_the_tasks_trace(api: Api):
    tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    given = api.client.post("/v1/tasks", json={"goal": "traced"}, headers=api.h(traceparent=tp)).json()
    minted = api.client.post("/v1/tasks", json={"goal": "untraced"}, headers=api.h(traceparent="junk")).json()
    with api.engine.connect() as conn:
        kept = get_task(conn, given["id"]).traceparent
        other = get_task(conn, minted["id"]).traceparent
    # same trace; the task's context is the API's `task.submit` span, a child of the caller's
    assert kept.split("-")[1] == tp.split("-")[1] and kept.split("-")[2] != tp.split("-")[2]
    assert other and other.split("-")[1] != tp.split("-")[1]


def test_concurrent_submissions_with_one_key_make_one_task(api: Api):
    from concurrent.futures import ThreadPoolExecutor

    h = api.h(**{"Idempotency-Key": "race"})
    with ThreadPoolExecutor(8) as pool:
        responses = list(
            pool.map(lambda _: api.client.post("/v1/tasks", json={"goal": "once"}, headers=h), range(16))
        )
    assert sorted(r.status_code for r in responses) == [200] * 15 + [201]
    assert len({r.json()["id"] for r in responses}) == 1


def test_allowed_tools_must_name_tools_this_deployment_knows(api: Api):
    # Before: ["rm_rf"] was accepted (201) and refused only when the model called it.
    b = _problem(
        api.client.post("/v1/tasks", json={"goal": "x", "allowed_tools": ["echo", "rm_rf"]}, headers=api.h()),
        422,
    )
    assert b["type"].endswith("invalid-task")
    assert "rm_rf" in b["detail"] and "echo" not in b["detail"].split(";")[0]  # names only the unknown one
    assert "calculator" in b["detail"] and "echo" in b["detail"]  # and lists the known ones
    # [] is a task with no tools (the model is offered none): valid. Known names are accepted.
    for tools in ([], ["echo", "calculator"]):
        r = api.client.post("/v1/tasks", json={"goal": "x", "allowed_tools": tools}, headers=api.h())
        assert r.status_code == 201, r.text
        assert api.client.get(f"/v1/tasks/{r.json()['id']}", headers=api.h()).json()["allowed_tools"] == tools

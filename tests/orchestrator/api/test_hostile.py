"""REST under hostile input, a database outage and overload (issue 15): one test per defect found."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from sqlalchemy import text, update

from orchestrator.api import create_app
from orchestrator.config import IngressSettings, Settings
from orchestrator.store import tasks_t
from testing.db_outage import database_down
from tests.orchestrator.api.conftest import make_keys
from tests.orchestrator.api.live_server import live_server
from tests.orchestrator.api.test_sse_e2e import _read_sse


def test_deeply_nested_body_is_a_400_before_parsing(api):
    # Before: FastAPI's json.loads raised RecursionError: a 500.
    body = b'{"goal": "x", "metadata": {"k": ' + b"[" * 20_000 + b"]" * 20_000 + b"}}"
    r = api.client.post("/v1/tasks", content=body, headers=api.h(**{"Content-Type": "application/json"}))
    assert r.status_code == 400, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["type"].endswith("/body-too-deep")
    ok = api.client.post("/v1/tasks", json={"goal": "x", "metadata": {"k": "v"}}, headers=api.h())
    assert ok.status_code == 201


@pytest.mark.parametrize("when", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_out_of_range_created_after_is_a_422(api, when):
    # Before: astimezone(UTC) raised OverflowError: a 500.
    for name in ("created_after", "created_before"):
        r = api.client.get("/v1/tasks", params={name: when}, headers=api.h())
        assert r.status_code == 422, r.text
        assert r.json()["type"].endswith("/validation-error")


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_sse_resumes_past_event_id_2_pow_31(api):
    # Before: events.seq was a 32-bit integer; the API accepted larger Last-Event-IDs all the same.
    task = api.client.post("/v1/tasks", json={"goal": "x"}, headers=api.h()).json()
    with api.engine.begin() as conn:
        conn.execute(update(tasks_t).where(tasks_t.c.id == task["id"]).values(event_seq=3_000_000_000))
    assert api.client.post(f"/v1/tasks/{task['id']}/cancel", headers=api.h()).status_code == 202
    for h in ({"Last-Event-ID": "3000000000"}, {}):
        params = {} if h else {"after": 3_000_000_000}
        with api.client.stream(
            "GET", f"/v1/tasks/{task['id']}/events", headers=api.h(**h), params=params
        ) as resp:
            assert resp.status_code == 200
            events = _read_sse(resp)
        assert [(e["id"], e["event"]) for e in events] == [("3000000001", "task.cancelled")]
    far = api.client.get(f"/v1/tasks/{task['id']}/events", params={"after": 10**19}, headers=api.h())
    assert far.status_code == 422


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_database_outage_is_a_503_with_retry_after(api):
    # Before: OperationalError fell through to the catch-all handler: a 500.
    assert api.client.get("/v1/tasks", headers=api.h()).status_code == 200  # the key is cached now
    with database_down(api.engine.url.database):
        for method, path, body in (("GET", "/v1/tasks", None), ("POST", "/v1/tasks", {"goal": "x"})):
            r = api.client.request(method, path, json=body, headers=api.h())
            assert r.status_code == 503, r.text
            assert r.headers["Retry-After"].isdigit()
            assert r.json()["type"].endswith("/database-unavailable")
        assert api.client.get("/readyz").status_code == 503
        assert api.client.get("/healthz").status_code == 200
    api.engine.dispose()  # drop the cut connections; the pool's pre-ping would too
    assert api.client.post("/v1/tasks", json={"goal": "x"}, headers=api.h()).status_code == 201


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_overload_is_shed_with_429_while_admitted_requests_complete(db, api_settings):
    # Before: requests past capacity queued without bound (p50 18.6 s at 2x capacity); then a
    # bare in-flight count without a queue bound. Now: 2 in flight, 1 waiting, the rest 429.
    keys = make_keys(db, "acme")
    ingress = IngressSettings(
        max_in_flight=2, max_queue=1, max_queue_wait_s=60, gc_freeze=False, sse_listen=False
    )
    app = create_app(api_settings, engine=db, ingress=ingress)
    h = {"Authorization": f"Bearer {keys['acme']}"}
    results: list[int] = []
    with live_server(app) as url, httpx.Client(base_url=url, timeout=60) as client:
        assert client.get("/v1/tasks", headers=h).status_code == 200  # warm the key cache
        door = _front_door(app)
        with db.connect() as lock:
            lock.execute(text("LOCK TABLE tasks IN ACCESS EXCLUSIVE MODE"))  # every submit now waits
            threads = [
                threading.Thread(
                    target=lambda i=i: results.append(
                        httpx.post(
                            f"{url}/v1/tasks", json={"goal": f"g{i}"}, headers=h, timeout=60
                        ).status_code
                    )
                )
                for i in range(3)
            ]
            for t in threads[:2]:
                t.start()
            _wait_for_lock_waiters(db, 2)  # both requests are in flight, blocked in the database
            threads[2].start()
            _wait_until(lambda: door.admission.queued == 1, "the third request to queue")
            shed = client.post("/v1/tasks", json={"goal": "fourth"}, headers=h)
            assert shed.status_code == 429 and shed.headers["Retry-After"].isdigit(), shed.text
            assert shed.json()["type"].endswith("/overloaded")
            assert client.get("/healthz").status_code == 200  # probes are never shed
            assert client.get("/readyz").status_code == 200
            lock.rollback()
        for t in threads:
            t.join(60)
        assert sorted(results) == [201, 201, 201]  # the admitted ones, the queued one included
        assert client.post("/v1/tasks", json={"goal": "after"}, headers=h).status_code == 201


def _front_door(app):
    from core.frontdoor import FrontDoor

    node = app.middleware_stack
    while not isinstance(node, FrontDoor):
        node = node.app
    return node


def _wait_until(cond, what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def _wait_for_lock_waiters(db, n: int, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        with db.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'"
                )
            ).scalar_one()
        if waiting >= n:
            return
        time.sleep(0.05)
    raise TimeoutError(f"{n} requests did not reach the lock")


@pytest.mark.parametrize(
    "body",
    [
        b'{"goal": "x", "metadata": {"n": 1e400}}',
        b'{"goal": "x", "metadata": {"n": NaN}}',
        b'{"goal": "x", "metadata": {"n": -Infinity}}',
        b'{"goal": "x", "messages": [{"role": "user", "content": [{"type": "text", "text": "t", "w": 1e999}]}]}',
    ],
    ids=["overflow", "nan", "neg-infinity", "content-part"],
)
def test_non_finite_numbers_are_422_not_500(api, body):
    # Before: the JSONB insert raised DataError: a 500.
    r = api.client.post("/v1/tasks", content=body, headers={**api.h(), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    assert any(e["type"] == "invalid_number" for e in r.json()["errors"])


def test_a_body_shorter_than_its_content_length_is_timed_out(db):
    # Before: the request held its connection (and an in-flight slot) with no body timeout.
    import socket

    ingress = IngressSettings(body_timeout_s=1.0, gc_freeze=False)
    app = create_app(Settings(DATABASE_URL=str(db.url)), engine=db, ingress=ingress)
    key = make_keys(db, "acme")["acme"]
    with live_server(app) as url:
        host, port = url.removeprefix("http://").split(":")
        with socket.create_connection((host, int(port)), timeout=30) as s:
            s.sendall(
                b"POST /v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                + f"Authorization: Bearer {key}\r\nContent-Length: 100\r\n\r\n".encode()
                + b'{"goal": '
            )
            answer = s.recv(4096)  # well within the 30 s socket timeout: the server answers at 1 s
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]

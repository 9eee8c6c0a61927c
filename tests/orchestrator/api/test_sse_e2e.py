"""REST end to end over a real socket: submit, a runner works, SSE events observed live by httpx,
then resumed with Last-Event-ID, on SQLite and PostgreSQL; the feed that wakes the streams (the
outbox tail)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import httpx

from orchestrator.api import create_app
from orchestrator.config import IngressSettings
from orchestrator.store import list_events
from tests.orchestrator.api.conftest import make_keys
from tests.orchestrator.api.live_server import live_server


def _read_sse(resp: httpx.Response) -> list[dict]:
    events, cur = [], {}
    for line in resp.iter_lines():
        if line == "":
            if "data" in cur:
                events.append(cur)
            cur = {}
        elif line.startswith(":"):
            continue
        else:
            field, _, value = line.partition(": ")
            cur[field] = value
    return events


def test_rest_submit_then_follow_events_live_and_resume(db, api_settings, make_runner):
    keys = make_keys(db, "acme", "globex")
    app = create_app(api_settings, engine=db, ingress=IngressSettings(sse_poll_s=0.2, gc_freeze=False))
    runner = make_runner()
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        h = {"Authorization": f"Bearer {keys['acme']}"}
        goal = "script:" + json.dumps({"cycles": 3, "tool": "echo"})
        task = client.post("/v1/tasks", json={"goal": goal}, headers=h).json()
        # follow from the start while the runner works in another thread
        worker = threading.Thread(target=runner.run_until_idle, kwargs={"timeout_s": 60})
        with client.stream("GET", f"/v1/tasks/{task['id']}/events", headers=h) as resp:
            assert resp.status_code == 200
            assert resp.headers["content-type"].startswith("text/event-stream")
            worker.start()
            live = _read_sse(resp)  # the stream ends by itself after the terminal event
        worker.join(timeout=60)
        with db.connect() as conn:
            want = [(e.seq, e.type) for e in list_events(conn, task["id"])]
        got = [(int(e["id"]), e["event"]) for e in live]
        assert got == want and got[-1][1] == "task.succeeded"
        assert [json.loads(e["data"])["seq"] for e in live] == [s for s, _ in want]
        assert sum(1 for _, t in got if t == "step.succeeded") == 7

        # resume after event 4: exactly the rest
        with client.stream(
            "GET", f"/v1/tasks/{task['id']}/events", headers={**h, "Last-Event-ID": "4"}
        ) as resp:
            rest = [(int(e["id"]), e["event"]) for e in _read_sse(resp)]
        assert rest == want[4:]
        # another tenant cannot stream it
        other = client.get(
            f"/v1/tasks/{task['id']}/events", headers={"Authorization": f"Bearer {keys['globex']}"}
        )
        assert other.status_code == 404

        final = client.get(f"/v1/tasks/{task['id']}", headers=h).json()
        assert final["status"] == "SUCCEEDED" and final["result"] == "done after 3 tool calls"
        assert len(final["steps"]) == 7 and all(len(s["attempts"]) == 1 for s in final["steps"])


@contextlib.asynccontextmanager
async def _tail_feed(engine):
    """An outbox tail feed that looks every 50 ms and polls only every 30 s, standing at the end."""
    from orchestrator.api.feed import OutboxTailFeed

    feed = OutboxTailFeed(engine, tail_s=0.05, poll_s=30.0)
    feed.start()
    try:
        await asyncio.to_thread(feed.connected.wait, 10)
        yield feed
    finally:
        feed.stop()


def test_feed_wakes_on_a_committed_event_before_the_poll_interval(db):
    from orchestrator.config import Budgets
    from orchestrator.store import NewTask, create_task, request_cancel

    async def scenario() -> float:
        async with _tail_feed(db) as feed:
            with db.begin() as conn:
                task_id, _ = create_task(conn, NewTask(tenant="t", goal="g"), Budgets())
            with feed.subscribe(task_id) as sub:
                sub.clear()
                t0 = time.monotonic()
                with db.begin() as conn:  # a new event for that task, committed
                    request_cancel(conn, task_id, "t")
                await sub.wait(30.0)
                return time.monotonic() - t0

    assert asyncio.run(scenario()) < 5.0  # woken by the outbox tail, not by the 30 s poll


def test_feed_wakes_on_an_event_committed_late_under_a_lower_id(pg_url):
    """Ids become visible in commit order: an event whose transaction was still open when the tail
    read past its id (a hole) wakes its stream once it commits."""
    from orchestrator.config import Budgets
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine
    from orchestrator.store import NewTask, create_task, request_cancel

    engine = make_engine(pg_url)
    migrate.upgrade(engine)

    async def scenario() -> tuple[bool, float]:
        async with _tail_feed(engine) as feed:
            with engine.begin() as conn:
                late_id, _ = create_task(conn, NewTask(tenant="t", goal="late"), Budgets())
            await asyncio.sleep(0.5)  # the tail has read past its creation
            with feed.subscribe(late_id) as sub:
                sub.clear()
                slow = engine.connect()
                txn = slow.begin()
                request_cancel(slow, late_id, "t")  # draws the lower event id, not committed yet
                with engine.begin() as conn:  # a higher id, committed first: the tail skips the hole
                    create_task(conn, NewTask(tenant="t", goal="early"), Budgets())
                await asyncio.sleep(0.5)  # several tail reads see the higher id only
                woken_early = sub.event.is_set()
                t0 = time.monotonic()
                txn.commit()
                slow.close()
                await sub.wait(30.0)
                return woken_early, time.monotonic() - t0

    try:
        woken_early, waited = asyncio.run(scenario())
        assert not woken_early  # nothing of that task was committed before
        assert waited < 5.0  # the hole was filled: woken by the tail, not by the 30 s poll
    finally:
        engine.dispose()


def test_images_uploaded_and_inline_are_preprocessed_and_the_task_runs(db, api_settings, make_runner):
    import base64
    import io

    from PIL import Image

    def image(fmt: str, color: tuple[int, int, int]) -> bytes:
        buf = io.BytesIO()
        Image.new("RGB", (64, 48), color).save(buf, format=fmt)
        return buf.getvalue()

    keys = make_keys(db, "acme")
    app = create_app(api_settings, engine=db, ingress=IngressSettings(sse_poll_s=0.2, gc_freeze=False))
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        h = {"Authorization": f"Bearer {keys['acme']}"}
        up = client.post(
            "/v1/attachments", content=image("PNG", (200, 10, 10)), headers={**h, "Content-Type": "image/png"}
        ).json()
        inline = {"data": base64.b64encode(image("JPEG", (10, 200, 10))).decode(), "media_type": "image/jpeg"}
        goal = "script:" + json.dumps({"cycles": 1, "tool": "echo"})
        task = client.post(
            "/v1/tasks", json={"goal": goal, "attachments": [{"upload_id": up["id"]}, inline]}, headers=h
        ).json()
        assert task["status"] == "PREPROCESSING"
        make_runner(blob_url=api_settings.blob_dir).run_until_idle(timeout_s=60)
        with client.stream("GET", f"/v1/tasks/{task['id']}/events", headers=h) as resp:
            types = [e["event"] for e in _read_sse(resp)]
        assert types.count("attachment.ready") == 2 and types[-1] == "task.succeeded"
        assert client.get(f"/v1/attachments/{up['id']}", headers=h).json()["status"] == "READY"


def test_feed_waits_out_a_database_it_cannot_reach():
    """No database: the tail backs off and keeps trying (streams fall back to polling); it never
    dies, and stops when asked."""
    from orchestrator.db.engine import make_engine

    engine = make_engine("postgresql+psycopg://postgres@127.0.0.1:1/none", pool_pre_ping=False)

    async def scenario() -> tuple[bool, bool, bool]:
        from orchestrator.api.feed import OutboxTailFeed

        feed = OutboxTailFeed(engine, tail_s=0.05, poll_s=30.0)
        feed.start()
        assert feed._thread is not None
        await asyncio.sleep(1.5)  # a few failed attempts
        alive, connected = feed._thread.is_alive(), feed.connected.is_set()
        feed.stop()
        return alive, connected, feed._thread.is_alive()

    try:
        alive, connected, alive_after_stop = asyncio.run(scenario())
        assert alive and not connected  # waiting it out
        assert not alive_after_stop
    finally:
        engine.dispose()


def test_a_stream_ends_when_its_key_is_revoked(db, api_settings):
    # Before: a stream opened before its key was revoked kept streaming.
    from orchestrator.auth import create_api_key, revoke_api_key

    with db.begin() as conn:
        made = create_api_key(conn, "acme")
    app = create_app(api_settings, engine=db, ingress=IngressSettings(sse_poll_s=0.2, gc_freeze=False))
    app.state.key_cache.ttl_s = 0.5  # how often a stream checks its key again
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        h = {"Authorization": f"Bearer {made.key}"}
        task = client.post("/v1/tasks", json={"goal": "nobody runs this"}, headers=h).json()
        with client.stream("GET", f"/v1/tasks/{task['id']}/events", headers=h) as resp:
            lines = resp.iter_lines()
            assert any(line.startswith("event: task.created") for line in lines)
            with db.begin() as conn:
                assert revoke_api_key(conn, made.id)
            rest = list(lines)  # the stream must end by itself (the client's read timeout is 30 s)
    assert "event: error" in rest and any("revoked" in line for line in rest)

"""The task timeline page (`/ui`) in a real headless Chromium (the Debian `chromium` package,
driven by Playwright): it loads with no external resources, lists and filters tasks, shows a
waterfall of steps and tool attempts (retries, errors, tokens), and updates live from the SSE
stream while a task runs. Screenshots land in pytest's tmp dir."""

from __future__ import annotations

import json
import os
import re
import shutil
import threading
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect

from orchestrator.api import create_app
from orchestrator.config import IngressSettings
from tests.orchestrator.api.conftest import make_keys
from tests.orchestrator.api.live_server import live_server

CHROMIUM = os.environ.get("DAYZERO_TEST_CHROMIUM", "/usr/bin/chromium")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
]
NOTE_SCREENSHOT = os.environ.get("DAYZERO_UI_SCREENSHOT_COPY")  # where to copy one PNG, if set


@pytest.fixture
def db_url(pg_url) -> str:  # PostgreSQL, with the outbox tail waking the SSE stream
    return pg_url


@pytest.fixture
def browser():
    from playwright.sync_api import sync_playwright

    # A missing browser is an error, never a skip: install it with `apt-get install -y chromium`.
    assert Path(CHROMIUM).exists(), f"{CHROMIUM} not found: apt-get install -y chromium"
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        yield b
        b.close()


def _submit(client: httpx.Client, h: dict, script: dict, label: str) -> str:
    body = {"goal": "script:" + json.dumps(script), "metadata": {"suite": "ui", "case": label}}
    r = client.post("/v1/tasks", json=body, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


def test_timeline_page_lists_shows_waterfall_and_follows_live(
    db, api_settings, make_runner, state_dir, browser, tmp_path
):
    keys = make_keys(db, "acme", "globex")
    ingress = IngressSettings(
        sse_poll_s=0.2, gc_freeze=False, trace_url_template="http://jaeger.local/trace/{trace_id}"
    )
    app = create_app(api_settings, engine=db, ingress=ingress)
    with live_server(app) as url, httpx.Client(base_url=url, timeout=30) as client:
        h = {"Authorization": f"Bearer {keys['acme']}"}
        # the shell is static and self-contained; the data behind it needs the key
        page_html = client.get("/ui/").text
        assert re.findall(r'(?:src|href)="([^"]+)"', page_html) == ["/ui/static/app.css", "/ui/static/app.js"]
        assert "default-src 'self'" in client.get("/ui/").headers["content-security-policy"]
        flaky = _submit(client, h, {"cycles": 2, "tool": "flaky", "args": {"fail_times": 1}}, "flaky")
        gated = _submit(client, h, {"cycles": 2, "tool": "gate"}, "gated")
        _submit(client, {"Authorization": f"Bearer {keys['globex']}"}, {"cycles": 0}, "other tenant")
        assert client.get(f"/ui/api/tasks/{flaky}").status_code == 401
        assert (
            client.get(
                f"/ui/api/tasks/{flaky}", headers={"Authorization": f"Bearer {keys['globex']}"}
            ).status_code
            == 404
        )

        runner = make_runner()
        worker = threading.Thread(target=runner.run_until_idle, kwargs={"timeout_s": 120}, daemon=True)
        worker.start()
        try:
            page = browser.new_page(viewport={"width": 1500, "height": 900})
            external = []
            page.on("request", lambda r: None if r.url.startswith(url) else external.append(r.url))
            page.goto(url + "/ui/")
            page.fill("#api-key", keys["acme"])
            page.click("#login button")

            # the list: this tenant's two tasks only; the status filter narrows it
            page.wait_for_selector(f'#tasks tr[data-id="{flaky}"][data-status="SUCCEEDED"]', timeout=60_000)
            page.wait_for_selector(f'#tasks tr[data-id="{gated}"][data-status="RUNNING"]', timeout=60_000)
            assert page.locator("#tasks tbody tr").count() == 2
            page.select_option("#f-status", "RUNNING")
            page.click("#filters button")
            expect(page.locator("#tasks tbody tr")).to_have_count(1)  # (the page's CSP forbids eval)
            expect(page.locator("#tasks tbody tr")).to_have_attribute("data-id", gated)
            page.select_option("#f-status", "")
            page.fill("#f-meta", "case=flaky")
            page.click("#filters button")
            # auto-retried: the previous filter's single row is on screen until the new list lands
            expect(page.locator("#tasks tbody tr")).to_have_attribute("data-id", flaky)
            expect(page.locator("#tasks tbody tr")).to_have_count(1)

            # the finished task's waterfall: five steps, each flaky tool step retried once
            expect(page.locator("#tasks tbody tr")).to_have_attribute("data-id", flaky)
            page.click(f'#tasks tr[data-id="{flaky}"]')
            page.wait_for_selector("#waterfall .row[data-step='4']")
            rows = page.locator("#waterfall .row[data-step]")
            assert [rows.nth(i).get_attribute("data-kind") for i in range(5)] == ["model", "tool"] * 2 + [
                "model"
            ]
            tool_row = page.locator("#waterfall .row[data-step='1']")
            assert tool_row.get_attribute("data-attempts") == "2"
            assert tool_row.locator(".bar.FAILED").count() == 1  # one bar per attempt
            assert tool_row.locator(".bar.SUCCEEDED").count() == 1
            assert tool_row.locator(".bar.RETRY_WAIT").count() == 1  # the backoff between them
            assert "transient failure 1" in tool_row.locator(".err").inner_text()
            assert "2 attempts" in tool_row.locator(".info").inner_text()
            model_info = page.locator("#waterfall .row[data-step='2'] .info").inner_text()
            assert re.search(r"in \d+ \(cached \d+\) · out 12", model_info), model_info
            trace_link = page.locator("#trace-link")
            with db.connect() as conn:
                tp = conn.exec_driver_sql(
                    "SELECT traceparent FROM tasks WHERE id = %s", (flaky,)
                ).scalar_one()
            assert trace_link.get_attribute("href") == f"http://jaeger.local/trace/{tp.split('-')[1]}"
            page.wait_for_selector("#live:has-text('finished')")
            page.screenshot(path=str(tmp_path / "timeline-retries.png"), full_page=True)

            # the running task: held at its first tool step; the page follows it live
            page.fill("#f-meta", "")
            page.click("#filters button")
            page.click(f'#tasks tr[data-id="{gated}"]')
            page.wait_for_selector("#waterfall .row[data-step='1'][data-status='RUNNING']")
            page.wait_for_selector("#live:has-text('live')")
            assert page.locator("#task-status").inner_text() == "RUNNING"
            assert page.locator("#waterfall .row[data-step]").count() == 2
            page.screenshot(path=str(tmp_path / "timeline-live-running.png"), full_page=True)
            (state_dir / "gate-open").touch()  # let the task go on; no reload from here on
            page.wait_for_selector("#task-status:has-text('SUCCEEDED')", timeout=60_000)
            page.wait_for_selector("#waterfall .row[data-step='4'][data-status='SUCCEEDED']")
            assert page.locator("#waterfall .row[data-status='SUCCEEDED']").count() == 5
            page.wait_for_selector("#live:has-text('task.succeeded')")
            page.screenshot(path=str(tmp_path / "timeline-live-done.png"), full_page=True)
            assert external == []  # no CDN, no other origin
        finally:
            (state_dir / "gate-open").touch()
            worker.join(timeout=60)

        metrics = client.get("/metrics").text
        assert re.search(r'^dayzero_tasks\{state="SUCCEEDED"\} 3\.0$', metrics, re.M)
        assert re.search(r'^dayzero_tasks\{state="RUNNING"\} 0\.0$', metrics, re.M)
        assert re.search(r"^dayzero_tasks_runnable 0\.0$", metrics, re.M)
    if NOTE_SCREENSHOT:
        shutil.copy(tmp_path / "timeline-retries.png", NOTE_SCREENSHOT)

"""The task page (`/ui`) in a real headless Chromium (the Debian `chromium` package, driven by
Playwright): it loads with no external resources, lists and filters tasks, shows a waterfall of
steps and tool attempts (retries, errors, tokens), and updates live from the SSE stream while a
task runs; a person signs in once per browser session, opens a task by its address, and reads
its goal and its answer or error in the list and on its page. Screenshots land in pytest's tmp
dir, or in `DAYZERO_UI_SCREENSHOT_DIR` (`docs/figures/ui` holds the committed ones)."""

from __future__ import annotations

import json
import logging
import os
import re
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
SCREENSHOT_DIR = os.environ.get("DAYZERO_UI_SCREENSHOT_DIR")  # where to write the PNGs, if set


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


GOALS = {  # what a person would ask; the scripted model reads its script from the system prompt
    "flaky": "Fetch the two quarterly figures from the finance service and add them up",
    "gated": "Wait for the approval, then file the expense report",
    "over budget": "Reconcile the three ledgers",
    "other tenant": "Summarise the attached report",
}


def _submit(client: httpx.Client, h: dict, script: dict, label: str, **extra) -> str:
    body = {
        "goal": GOALS[label],
        "system_prompt": "script:" + json.dumps(script),
        "metadata": {"suite": "ui", "case": label},
        **extra,
    }
    r = client.post("/v1/tasks", json=body, headers=h)
    assert r.status_code == 201, r.text
    return r.json()["id"]


class _Lines(logging.Handler):
    """The API's access log lines, formatted as `dayzero serve` writes them."""

    def __init__(self) -> None:
        from orchestrator.logs import LogfmtFormatter

        super().__init__()
        self.setFormatter(LogfmtFormatter())
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))


@pytest.fixture
def access_log():
    logger, handler = logging.getLogger("dayzero.access"), _Lines()
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(handler)
    yield handler.lines
    logger.removeHandler(handler)
    logger.setLevel(level)


OVERFLOWING = """() => [...document.querySelectorAll('#tasks td, #tasks td > *')]
  .filter((e) => !e.classList.contains('clip') && e.scrollWidth > e.clientWidth + 1)
  .map((e) => e.className + ': ' + e.textContent)"""


def test_timeline_page_lists_shows_waterfall_and_follows_live(
    db, api_settings, make_runner, state_dir, browser, tmp_path, access_log
):
    shots = Path(SCREENSHOT_DIR) if SCREENSHOT_DIR else tmp_path
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

        page = browser.new_page(viewport={"width": 1440, "height": 860})
        requested: list[str] = []
        page.on("request", lambda r: requested.append(r.url))
        # signed out: what to do, not an empty table
        page.goto(url + "/ui/")
        expect(page.locator("#signin-hint")).to_be_visible()
        expect(page.locator("#signin-hint")).to_contain_text("dayzero apikey create --tenant")
        expect(page.locator("main")).to_be_hidden()
        page.fill("#api-key", "dz_not-a-key")
        page.click("#login button")
        expect(page.locator("#login-msg")).to_have_text("the API key was refused")
        expect(page.locator("main")).to_be_hidden()
        page.fill("#api-key", keys["acme"])
        page.click("#login button")
        expect(page.locator("#list-msg")).to_contain_text("No tasks yet")
        expect(page.locator("#list-msg")).to_contain_text("dayzero submit")
        page.screenshot(path=str(shots / "ui-empty.png"))

        flaky = _submit(client, h, {"cycles": 2, "tool": "flaky", "args": {"fail_times": 1}}, "flaky")
        over = _submit(client, h, {"cycles": 3}, "over budget", budget={"max_steps": 2})
        # (one runner: the gated task, held at its tool step, goes last)
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
            # the list: this tenant's three tasks only; each row's goal, answer or error, full id
            page.wait_for_selector(f'#tasks tr[data-id="{flaky}"][data-status="SUCCEEDED"]', timeout=60_000)
            page.wait_for_selector(f'#tasks tr[data-id="{gated}"][data-status="RUNNING"]', timeout=60_000)
            page.wait_for_selector(f'#tasks tr[data-id="{over}"][data-status="FAILED"]', timeout=60_000)
            assert page.locator("#tasks tbody tr").count() == 3
            row = page.locator(f'#tasks tr[data-id="{flaky}"]')
            assert row.locator(".goal").inner_text() == GOALS["flaky"]
            assert row.locator(".outcome").inner_text() == "done after 2 tool calls"
            assert "answer" in row.locator(".outcome").get_attribute("class")
            over_outcome = page.locator(f'#tasks tr[data-id="{over}"] .outcome')
            assert over_outcome.inner_text().startswith("FAILED: budget_exhausted")
            assert page.locator(f'#tasks tr[data-id="{gated}"] .outcome').inner_text() == "no answer yet"
            # every id whole (adjacent ids share their first characters), no cell spilling over;
            # only the goal and answer lines are cut, with the full text in their tooltip
            for tid in (flaky, gated, over):
                assert page.locator(f'#tasks tr[data-id="{tid}"] .id').inner_text() == tid
            assert page.evaluate(OVERFLOWING) == []
            heights = page.evaluate("[...document.querySelectorAll('#tasks .id')].map((e) => e.clientHeight)")
            assert max(heights) < 20, heights  # one line each
            clipped = page.locator("#tasks .clip")
            for i in range(clipped.count()):
                assert clipped.nth(i).get_attribute("title") == clipped.nth(i).inner_text()

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

            # the finished task's page: goal, answer, and a waterfall of five steps, each flaky
            # tool step retried once; its address is a link to it
            page.click(f'#tasks tr[data-id="{flaky}"] td.status')
            assert page.url == f"{url}/ui/#/tasks/{flaky}"
            page.wait_for_selector("#waterfall .row[data-step='4']")
            expect(page.locator("#task-goal .text")).to_have_text(GOALS["flaky"])
            expect(page.locator("#task-answer .text")).to_have_text("done after 2 tool calls")
            assert page.locator("#task-link").get_attribute("href") == f"#/tasks/{flaky}"
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
            page.fill("#f-meta", "")
            page.click("#filters button")
            expect(page.locator("#tasks tbody tr")).to_have_count(3)
            page.screenshot(path=str(shots / "ui-task-retries.png"))

            # the key is kept for the browser session: a reload stays signed in, on the task
            page.reload()
            expect(page.locator("#task-answer .text")).to_have_text("done after 2 tool calls")
            expect(page.locator("#who")).to_be_visible()

            # the failed task's page shows its error
            page.click(f'#tasks tr[data-id="{over}"] .goal')
            expect(page.locator("#task-error .text")).to_contain_text("budget_exhausted")
            expect(page.locator("#task-error h3")).to_have_text("failed")

            # the running task: held at its first tool step; the page follows it live and its
            # answer appears without a reload
            page.click(f'#tasks tr[data-id="{gated}"] td.num >> nth=0')
            page.wait_for_selector("#waterfall .row[data-step='1'][data-status='RUNNING']")
            page.wait_for_selector("#live:has-text('live')")
            assert page.locator("#task-status").inner_text() == "RUNNING"
            expect(page.locator("#task-pending")).to_have_text("no answer yet")
            assert page.locator("#waterfall .row[data-step]").count() == 2
            page.screenshot(path=str(shots / "ui-task-live-running.png"))
            (state_dir / "gate-open").touch()  # let the task go on; no reload from here on
            page.wait_for_selector("#task-status:has-text('SUCCEEDED')", timeout=60_000)
            page.wait_for_selector("#waterfall .row[data-step='4'][data-status='SUCCEEDED']")
            assert page.locator("#waterfall .row[data-status='SUCCEEDED']").count() == 5
            expect(page.locator("#task-answer .text")).to_have_text("done after 2 tool calls")
            page.wait_for_selector("#live:has-text('task.succeeded')")
            expect(page.locator(f'#tasks tr[data-id="{gated}"] .outcome')).to_have_text(
                "done after 2 tool calls"
            )

            # a teammate opens the task's address in another browser: signs in, lands on it
            other = browser.new_context(viewport={"width": 1440, "height": 860})
            mate = other.new_page()
            mate.on("request", lambda r: requested.append(r.url))
            mate.goto(f"{url}/ui/#/tasks/{gated}")
            expect(mate.locator("#signin-target")).to_have_text(f"Sign in to open task {gated}.")
            mate.screenshot(path=str(shots / "ui-sign-in.png"))
            mate.fill("#api-key", keys["acme"])
            mate.click("#login button")
            expect(mate.locator("#task-answer .text")).to_have_text("done after 2 tool calls")
            # … a teammate of another tenant does not see it
            mate.click("#logout")
            assert mate.evaluate("sessionStorage.getItem('dayzero.key')") is None
            expect(mate.locator("#signin-hint")).to_be_visible()
            mate.fill("#api-key", keys["globex"])
            mate.click("#login button")
            expect(mate.locator("#detail-head")).to_contain_text(
                "not found (or it belongs to another tenant)"
            )
            other.close()
        finally:
            (state_dir / "gate-open").touch()
            worker.join(timeout=60)

        metrics = client.get("/metrics").text
        assert re.search(r'^dayzero_tasks\{state="SUCCEEDED"\} 3\.0$', metrics, re.M)
        assert re.search(r'^dayzero_tasks\{state="FAILED"\} 1\.0$', metrics, re.M)
        assert re.search(r'^dayzero_tasks\{state="RUNNING"\} 0\.0$', metrics, re.M)
        assert re.search(r"^dayzero_tasks_runnable 0\.0$", metrics, re.M)

    # no CDN, no other origin; the key in no URL and no server log line
    assert [u for u in requested if not u.startswith(url)] == []
    assert not any(keys["acme"] in u or keys["globex"] in u for u in requested)
    assert any(f"path=/ui/api/tasks/{gated}" in line for line in access_log)
    assert not any(k in line for line in access_log for k in (keys["acme"], keys["globex"], "dz_not-a-key"))

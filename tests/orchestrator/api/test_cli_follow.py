"""`dayzero submit --attach FILE --follow "…"` as a user runs it against a real API server and a
runner: the files are uploaded and attached, the transcript is shown as `dayzero run` shows it
(model turns, tool calls, tool results, the answer), the answer is printed and the exit code is
the task's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from orchestrator.api import create_app
from orchestrator.config import IngressSettings
from orchestrator.db.tables import attachments_t, tasks_t
from tests.orchestrator.api.conftest import make_keys
from tests.orchestrator.api.live_server import live_server
from tests.preprocess.pdfs import Page, make_pdf


@pytest.fixture
def db_url(pg_url) -> str:  # PostgreSQL, with the outbox tail waking the SSE stream
    return pg_url


def _submit(url: str, key: str, *args: str, cwd) -> subprocess.CompletedProcess:  # type: ignore[no-untyped-def]
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "submit", "--url", url, *args],
        env={**os.environ, "DAYZERO_API_KEY": key},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_submit_attach_follow_prints_the_transcript_and_exits_with_the_task(
    db, api_settings, make_runner, tmp_path
):
    key = make_keys(db, "acme")["acme"]
    (tmp_path / "report.pdf").write_bytes(make_pdf([Page(lines=["Quarterly report", "Revenue grew 12%."])]))
    Image.fromarray(np.zeros((40, 60, 3), dtype=np.uint8)).save(tmp_path / "chart.png")
    (tmp_path / "notes.docx").write_bytes(b"PK\x03\x04")
    app = create_app(api_settings, engine=db, ingress=IngressSettings(sse_poll_s=0.2, gc_freeze=False))
    runner = make_runner()
    worker = threading.Thread(target=runner.run_forever, daemon=True)
    with live_server(app) as url:
        worker.start()
        script = "script:" + json.dumps({"cycles": 1, "tool": "echo", "args": {"text": "hello {i}"}})
        ok = _submit(
            url, key, "--attach", "report.pdf", "--attach", "chart.png", "--follow", script, cwd=tmp_path
        )
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert ok.stdout == "done after 1 tool calls\n"  # the answer, alone on stdout
        err = ok.stderr
        assert f"user: {script} [attachment] [attachment]" in err
        assert '(turn 1) → echo({"text": "hello 0"})' in err
        assert "← echo: " in err and "hello 0" in err.split("← echo: ", 1)[1]
        assert "answer (turn 2): done after 1 tool calls" in err
        assert err.index("→ echo") < err.index("← echo") < err.index("answer (turn 2)")

        task_id = err.split("task ", 1)[1].split()[0]
        with db.connect() as conn:
            atts = conn.execute(select(attachments_t).where(attachments_t.c.task_id == task_id)).all()
        assert sorted((a.filename, a.media_type, a.status) for a in atts) == [
            ("chart.png", "image/png", "READY"),
            ("report.pdf", "application/pdf", "READY"),
        ]

        # a task that fails: its status and error on stdout, exit code 1
        failing = _submit(url, key, "--max-steps", "1", "--follow", script, cwd=tmp_path)
        assert failing.returncode == 1, failing.stderr
        assert failing.stdout.startswith("FAILED: ") and "budget_exhausted" in failing.stdout
        assert "→ echo(" in failing.stderr

        # a file the API does not take is refused before anything is submitted
        with db.connect() as conn:
            before = conn.execute(select(tasks_t.c.id)).all()
        refused = _submit(url, key, "--attach", "notes.docx", "summarise", cwd=tmp_path)
        assert refused.returncode != 0 and "images (PNG, JPEG, WebP, GIF) or PDFs" in refused.stderr
        with db.connect() as conn:
            assert conn.execute(select(tasks_t.c.id)).all() == before
    runner.stop()
    worker.join(timeout=30)

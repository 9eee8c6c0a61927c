"""`dayzero runner` as an operator reads its stderr: one logfmt line per task start, step attempt
and end, and a line when SIGTERM stops it; never a message's content."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.db.engine import make_engine
from orchestrator.tasks.queries import get_task
from tests.orchestrator.conftest import submit

REPO = Path(__file__).resolve().parents[2]
LINE = re.compile(
    r'^ts=\S+Z level=(\w+) logger=(\S+) msg=("(?:[^"\\]|\\.)*"|\S+)((?: \w+=(?:"(?:[^"\\]|\\.)*"|\S+))*)$'
)


def _fields(rest: str) -> dict[str, str]:
    return {k: v.strip('"') for k, v in re.findall(r'(\w+)=("(?:[^"\\]|\\.)*"|\S+)', rest)}


@pytest.fixture
def db_url(pg_url) -> str:
    return pg_url


def test_runner_logs_each_task_and_its_steps_and_the_stop(db, db_url, model_server, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAYZERO_", "CELERY_", "KAFKA_"))}
    env.update(
        DATABASE_URL=db_url,
        DAYZERO_INFERENCE_URL=model_server.url,
        DAYZERO_INFERENCE_MODEL="scripted",
        DAYZERO_TOOL_MODULES="testing.fixture_tools",
        DAYZERO_WORKSPACE_DIR=str(tmp_path / "ws"),
        DAYZERO_POLL_INTERVAL_S="0.05",
        PYTHONPATH=str(REPO),
    )
    task_id = submit(db, {"cycles": 2, "tool": "echo", "args": {"secret": "do-not-log-{i}"}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "runner", "--id", "r-logs"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        engine = make_engine(db_url)
        end = time.monotonic() + 60
        while True:
            with engine.connect() as conn:
                if get_task(conn, task_id).status == "SUCCEEDED":
                    break
            assert proc.poll() is None and time.monotonic() < end, "the task did not finish"
            time.sleep(0.1)
        engine.dispose()
        time.sleep(0.3)  # the end line is written by the log thread
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    lines = [LINE.match(line) for line in err.splitlines()]
    assert all(lines), [line for line, m in zip(err.splitlines(), lines, strict=True) if not m]
    task_lines = [(m.group(3), _fields(m.group(4))) for m in lines if m.group(2) == "dayzero.task"]
    assert [msg for msg, _ in task_lines] == ["task.start"] + ["task.step"] * 5 + ["task.end"]
    start, *steps, done = (f for _, f in task_lines)
    assert start["task"] == task_id and start["runner"] == "r-logs" and start["status"] == "READY"
    assert [(s["step"], s["kind"], s.get("tool"), s["outcome"]) for s in steps] == [
        ("0", "model", None, "succeeded"), ("1", "tool", "echo", "succeeded"),
        ("2", "model", None, "succeeded"), ("3", "tool", "echo", "succeeded"),
        ("4", "model", None, "succeeded"),
    ]  # fmt: skip
    assert all(float(s["ms"]) >= 0 and s["attempt"] == "1" for s in steps)
    assert done["status"] == "SUCCEEDED" and done["steps"] == "5" and int(done["tokens_out"]) == 36
    assert "do-not-log" not in err  # tool arguments (and every other content) stay in the database
    messages = [m.group(3) for m in lines if m.group(2) == "dayzero"]
    assert messages[-2:] == ['"SIGTERM received: stopping"', '"runner r-logs stopped"']
    assert not any(m.group(2) == "httpx" for m in lines)  # a line per model call is the step's line

"""`dayzero run "<goal>" --image F` as a user runs it on a fresh machine: nothing configured, so
SQLite, in-process dispatch and the embedded vision-language engine on CPU, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from PIL import Image


def test_run_with_an_image_on_the_embedded_default(tmp_path):
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (90, 130, 3), dtype=np.uint8)).save(
        tmp_path / "photo.png"
    )
    # the embedded default: no database, broker, Kafka or inference URL from the surroundings
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "CELERY_", "KAFKA_", "DAYZERO_", "OTEL_"))
    }
    proc = subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", "Describe the photo", "--image", "photo.png",
         "--max-steps", "1", "--json"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode in (0, 1), proc.stderr[-3000:]
    task = json.loads(proc.stdout)
    # a random-weight model may stop at the step budget, but every step ran: no error kind other
    # than the budget, and the image reached the model as a content part
    assert task["status"] in ("SUCCEEDED", "FAILED"), task
    if task["status"] == "FAILED":
        assert task["error"]["kind"] == "budget_exhausted", task["error"]
    user = task["messages"][0]
    assert user["role"] == "user"
    parts = user["content"]
    assert any(p.get("type") == "image_url" for p in parts), parts
    assert len(task["messages"]) >= 2  # the model answered at least once
    assert (tmp_path / "dayzero.db").exists()


def _cli(tmp_path, model_url: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "CELERY_", "KAFKA_", "DAYZERO_", "OTEL_"))
    }
    env.update(DAYZERO_INFERENCE_URL=model_url, DAYZERO_TOOL_MODULES="testing.fixture_tools",
               PYTHONPATH=os.environ.get("PYTHONPATH", os.getcwd()))  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (("",), "goal"),
        (("x" * 40_000,), "goal"),
        (("g", "--tools", "rm_rf"), "allowed_tools names unknown tool(s) rm_rf"),
        (("g", "--image", "missing.png"), "no such image file: missing.png"),
        (("g", "--max-steps", "0"), "max_steps"),
    ],
    ids=["empty-goal", "long-goal", "unknown-tool", "missing-image", "zero-steps"],
)
def test_invalid_input_is_one_line_and_exit_2(tmp_path, model_server, args, says):
    # Before: REST refused these (422) while `dayzero run` accepted them or printed a traceback.
    proc = _cli(tmp_path, model_server.url, *args)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("dayzero run: ") and says in last, proc.stderr[-2000:]


def test_timeout_is_enforced_and_cancels_the_task(tmp_path, model_server):
    # Before: `--timeout 2` ran as long as the model call took (15 s), then printed a traceback.
    goal = "script:" + json.dumps({"cycles": 0, "sleep_s": 60})  # an answer that comes after 60 s
    proc = _cli(tmp_path, model_server.url, goal, "--timeout", "2", "--json", timeout=50)
    assert proc.returncode == 3, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr
    assert json.loads(proc.stdout)["status"] == "CANCELLED"

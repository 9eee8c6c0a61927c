"""`dayzero run` on the embedded default (the trained demo model on CPU) for a handful of held-out
tasks: the live display shows the tool call, and the printed answer is right."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from inference.demo_model.corpus import ToolBox, eval_tasks
from inference.demo_model.evaluate import answer_ok
from inference.demo_model.spec import DEMO_DIR

pytestmark = pytest.mark.skipif(
    not (DEMO_DIR / "checksums.sha256.json").is_file(), reason="demo checkpoint not trained yet"
)


def _run(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DATABASE_", "CELERY_", "KAFKA_", "DAYZERO_", "OTEL_"))
    }
    env["COLUMNS"] = "200"  # rich wraps at the terminal width; keep one call on one line
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", "run", *args],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_run_shows_the_calculator_call_and_answers(tmp_path):
    proc = _run(tmp_path, "What is 1234*5678 + 91?")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "→ calculator" in proc.stderr and "1234*5678 + 91" in proc.stderr, proc.stderr
    assert "← calculator" in proc.stderr and "7006743" in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "1234*5678 + 91 = 7006743."


@pytest.mark.parametrize("category", ["calc_multi", "calc_word", "plain"])
def test_run_answers_held_out_tasks(tmp_path, category):
    task = next(t for t in eval_tasks(ToolBox(), 3) if t.category == category)
    proc = _run(tmp_path, task.turns[0].user, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "SUCCEEDED"
    assert answer_ok(out["result"], task.turns[0]), (out["result"], task.turns[0].expected)
    calls = [c for m in out["messages"] for c in m.get("tool_calls") or []]
    assert bool(calls) == (category != "plain")

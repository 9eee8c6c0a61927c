"""`dayzero run` on the embedded default (the trained demo model on CPU) for a handful of held-out
tasks, images and PDFs attached with `--image`: the live display shows the tool call, and the
printed answer is right."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.inference.demo_model import needs_corpus_checkpoint
from training.demo_model.corpus import ToolBox, eval_tasks


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


def test_run_shows_the_tool_call_its_result_and_the_answer_live(tmp_path):
    proc = _run(tmp_path, "What is 1234*5678 + 91?")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stderr.splitlines()
    call = next(i for i, x in enumerate(lines) if "→ calculator(" in x)
    result = next(i for i, x in enumerate(lines) if "← calculator:" in x)
    answer = next(i for i, x in enumerate(lines) if x.startswith("answer (turn 2):"))
    assert call < result < answer
    args = json.loads(lines[call].split("→ calculator(", 1)[1].rsplit(")", 1)[0])
    assert set(args) == {"expression"} and args["expression"].startswith("1234*5")
    # the printed result is the model's final answer
    assert lines[answer].endswith(proc.stdout.strip().splitlines()[-1])


def test_run_answers_the_demo_question_correctly(tmp_path):
    proc = _run(tmp_path, "What is 1234*5678 + 91?")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "7006743" in proc.stdout.strip().splitlines()[-1]  # the answer's wording is the checkpoint's


@needs_corpus_checkpoint  # held-out families: the checkpoint trained on this corpus
@pytest.mark.parametrize("category", ["calc_word", "number_words", "image", "document", "plain"])
def test_run_on_held_out_tasks_uses_the_right_tools(tmp_path, category):
    task = next(
        t
        for t in eval_tasks(ToolBox(), 3, (category,))
        if t.turns[0].tool or category in ("document", "plain")
    )
    turn = task.turns[0]
    files = []
    for f in turn.files:
        (tmp_path / f.name).write_bytes(f.data)
        files += ["--image", f.name]
    proc = _run(tmp_path, turn.user, *files, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout)
    assert out["status"] == "SUCCEEDED" and out["result"]
    names = [c["function"]["name"] for m in out["messages"] for c in m.get("tool_calls") or []]
    assert names == ([turn.tool] if turn.tool else [])
    assert all(n in out["result"] for n in turn.needles) if turn.needles else out["result"] == turn.expected

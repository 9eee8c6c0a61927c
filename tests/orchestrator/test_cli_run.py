"""`dayzero run "<goal>" --image F` as a user runs it on a fresh machine: nothing configured, so
SQLite, in-process dispatch and the embedded vision-language engine on CPU, end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
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

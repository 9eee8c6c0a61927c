"""`dayzero db upgrade|current` as a user runs them, on SQLite and PostgreSQL."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _dayzero(url: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DATABASE_URL": url}
    return subprocess.run(
        [sys.executable, "-m", "orchestrator.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_db_upgrade_then_current(db_url):
    before = _dayzero(db_url, "db", "current")
    assert before.returncode == 1 and "current: None" in before.stdout
    up = _dayzero(db_url, "db", "upgrade")
    assert up.returncode == 0, up.stderr
    after = _dayzero(db_url, "db", "current")
    assert after.returncode == 0 and after.stdout.split()[1] == after.stdout.split()[3]

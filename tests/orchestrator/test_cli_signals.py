"""SIGTERM during a long-running command's start-up is not lost (`orchestrator.commands.signals`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from orchestrator.commands.signals import hand_over, stop_on_signals

REPO = Path(__file__).resolve().parents[2]


def test_a_signal_before_the_hand_over_reaches_the_loop():
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        early = stop_on_signals()
        os.kill(os.getpid(), signal.SIGTERM)  # handled in this (main) thread before kill returns here
        assert early.is_set()
        calls: list[str] = []
        hand_over(early, lambda: calls.append("stop"))
        assert calls == ["stop"]  # the start-up signal is passed on
        os.kill(os.getpid(), signal.SIGINT)
        assert calls == ["stop", "stop"]  # and later ones go to the loop
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def test_runner_told_to_stop_while_it_is_being_built_exits(tmp_path):
    """The SIGTERM lands inside `make_runner` (after the database answered): the runner must not
    start its loop as if nothing had been asked."""
    script = textwrap.dedent(
        """
        import os, signal, sys
        import orchestrator.app as app
        from orchestrator.cli import main

        real = app.make_runner

        def make_runner(*args, **kwargs):
            parts = real(*args, **kwargs)
            os.kill(os.getpid(), signal.SIGTERM)
            return parts

        app.make_runner = make_runner
        sys.exit(main(["runner", "--upgrade"]))
        """
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DAYZERO_", "CELERY_", "KAFKA_"))}
    env.update(
        DATABASE_URL=f"sqlite:///{tmp_path / 'db.sqlite'}",
        DAYZERO_INFERENCE_URL="http://127.0.0.1:9",
        DAYZERO_WORKSPACE_DIR=str(tmp_path / "ws"),
        PYTHONPATH=str(REPO),
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr

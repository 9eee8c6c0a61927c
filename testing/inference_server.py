"""`dayzero infer serve` as a real subprocess on a free loopback port, for tests and benchmarks
that talk to it over HTTP."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def served(args: Sequence[str], *, log: Path | None = None, timeout_s: float = 300) -> Iterator[str]:
    """Start `dayzero infer serve ARGS --port P` (the environment's DAYZERO_* variables left out),
    wait until it answers, yield its URL, stop it."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("DAYZERO_")}
    env.update(PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "orchestrator.cli", "infer", "serve", *args, "--port", str(port)]
    out = log.open("wb") if log is not None else subprocess.DEVNULL
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"

    def tail() -> str:
        return log.read_text(errors="replace")[-2000:] if log is not None else "(no log kept)"

    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"`{' '.join(cmd)}` exited with {proc.returncode}: {tail()}")
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"`{' '.join(cmd)}` did not answer in {timeout_s:.0f} s: {tail()}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()

"""Fixtures for worker tests against the real Redis at 127.0.0.1:6379 (REDIS_URL overrides)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from PIL import Image

from preprocess import BlobStore
from tests.preprocess.images import smooth_rgb

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("DAYZERO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
def image_blob(tmp_path) -> tuple[str, str]:
    """(blob_url, sha256) of a stored 640x480 PNG."""
    url = str(tmp_path / "blobs")
    buf = io.BytesIO()
    Image.fromarray(smooth_rgb(640, 480, seed=21)).save(buf, "PNG")
    return url, BlobStore(url).put(buf.getvalue())


@dataclass
class WorkerEnv:
    prefix: str
    redis: redis.Redis
    log_dir: Path

    def counter(self, name: str) -> int:
        return int(self.redis.get(self.prefix + name) or 0)

    def start_worker(
        self, pool: str = "prefork", name: str = "w", extra_env: dict[str, str] | None = None
    ) -> subprocess.Popen:
        log = self.log_dir / f"{name}.log"
        env = {
            **os.environ,
            **(extra_env or {}),
            "PYTHONPATH": str(REPO),
            "DZ_TEST_PREFIX": self.prefix,
            "CELERY_BROKER_URL": REDIS_URL,
            "CELERY_RESULT_BACKEND": REDIS_URL,
        }
        cmd = [
            sys.executable, "-m", "celery", "-A", "testing.celery_test_app", "worker",
            "--queues", "preprocess", "--pool", pool, "--concurrency", "1", "--loglevel", "INFO",
            "--hostname", f"{name}-{self.prefix}@%h", "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        proc = subprocess.Popen(
            cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if b" ready." in log.read_bytes():
                return proc
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        kill_group(proc)
        raise AssertionError(f"worker did not start:\n{log.read_text(errors='replace')[-3000:]}")


def kill_group(proc: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
    proc.wait(timeout=30)


@pytest.fixture
def worker_env(tmp_path) -> Iterator[WorkerEnv]:
    client = redis.Redis.from_url(REDIS_URL)
    client.ping()  # fails (never skips) without the server
    env = WorkerEnv(prefix=f"dztest-{uuid.uuid4().hex[:10]}-", redis=client, log_dir=tmp_path)
    yield env
    for key in client.scan_iter(match=env.prefix + "*", count=500):
        client.delete(key)


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")

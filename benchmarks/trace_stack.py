"""The processes of an agent-trace run (`benchmarks.agent_traces`): `dayzero infer serve`, the
REST API, a Celery tool worker and one runner per concurrent task, the runners pointed at the
trace's scripted proxy; each logs to its own file; all stopped on exit."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """The processes of one run, each logging under `log_dir`; stopped on exit."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir, self.env = log_dir, env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, name: str, *args: str, **env: str) -> None:
        log = (self.log_dir / f"{name}.log").open("wb")
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=REPO, env={**self.env, **env}, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip

    def wait_http(self, name: str, url: str, timeout_s: float = 300) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.procs[name].poll() is not None:
                raise SystemExit(f"{name} exited:\n{(self.log_dir / f'{name}.log').read_text()[-3000:]}")
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.3)
        raise SystemExit(f"{name} not up at {url}")

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


@dataclass(frozen=True, slots=True)
class StackOptions:
    model: str | None  # a checkpoint folder; None: --dummy
    max_model_len: int
    runners: int
    redis_db: int = 12
    wire: str = "incremental"
    infer_args: tuple[str, ...] = field(default_factory=tuple)


@contextmanager
def stack(db_url: str, work: Path, o: StackOptions) -> Iterator[tuple[str, Any]]:
    """Start the services; yields (API base URL, the proxy)."""
    broker = f"redis://127.0.0.1:6379/{o.redis_db}"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DAYZERO_", "CELERY_", "KAFKA_"))},
        "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
        "DATABASE_URL": db_url, "CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": broker,
        "DAYZERO_BLOB_DIR": str(work / "blobs"), "DAYZERO_WORKSPACE_DIR": str(work / "ws"),
        "DAYZERO_POLL_INTERVAL_S": "0.05", "DAYZERO_BUDGET_MAX_STEPS": "100000",
        "DAYZERO_BUDGET_MAX_TOKENS": "2000000000", "DAYZERO_BUDGET_DEADLINE_S": "86400",
    }  # fmt: skip
    s = Stack(work, env)
    port = free_port()
    infer = f"http://127.0.0.1:{port}"
    source = ["--model", o.model] if o.model else ["--dummy"]
    try:
        s.start("inference", "infer", "serve", *source, "--port", str(port), "--device", "cpu",
                "--served-model-name", "trace", "--max-model-len", str(o.max_model_len), *o.infer_args)  # fmt: skip
        api_port = free_port()
        s.start("api", "serve", "--port", str(api_port), "--log-level", "warning")
        wport = free_port()
        s.start("worker", "worker", "--queues", "tools", "--pool", "solo", "--metrics-port", str(wport),
                "--hostname", f"traces-{uuid.uuid4().hex[:8]}@%h")  # fmt: skip
        s.wait_http("inference", infer + "/health", timeout_s=600)
        from benchmarks.trace_script import ScriptedProxy

        with ScriptedProxy(infer, hide_conversation=o.wire == "full") as proxy:
            for i in range(o.runners):
                rport = free_port()
                s.start(f"runner{i}", "runner", "--metrics-port", str(rport),
                        DAYZERO_INFERENCE_URL=proxy.url, DAYZERO_INFERENCE_MODEL="trace")  # fmt: skip
                s.wait_http(f"runner{i}", f"http://127.0.0.1:{rport}/metrics")
            api = f"http://127.0.0.1:{api_port}"
            s.wait_http("api", api + "/readyz")
            s.wait_http("worker", f"http://127.0.0.1:{wport}/metrics")
            yield api, proxy
    finally:
        s.stop()

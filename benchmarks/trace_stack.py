"""The processes of an agent-trace run (`benchmarks.agent_traces`): `dayzero infer serve`, the
REST API, one runner per concurrent task (the runners pointed at the trace's scripted proxy) and,
with PostgreSQL services, a Celery tool worker; each logs to its own file; all stopped on exit.

Two service sets (`StackOptions.services`): `postgres`, a scratch PostgreSQL database and a Celery
tool worker on Redis; `local`, what the product runs on with no services at all: a SQLite file in
the run's work folder and tools dispatched in-process by each runner (no broker set), for hosts
that have neither PostgreSQL nor Redis (a GPU host)."""

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
from typing import Any, Literal

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


Services = Literal["postgres", "local"]


@dataclass(frozen=True, slots=True)
class StackOptions:
    """How a run's stack is made; the one place that chooses its services."""

    model: str | None  # a checkpoint folder; None: --dummy
    max_model_len: int
    runners: int
    services: Services = "postgres"
    device: str = "cpu"  # `dayzero infer serve --device`
    dummy_config: str = ""  # with no model: a config.json of random weights; "": the small test model
    redis_db: int = 12
    wire: str = "incremental"
    infer_args: tuple[str, ...] = field(default_factory=tuple)

    @property
    def celery(self) -> bool:
        """Tools go through a Celery worker (else each runner dispatches them in-process)."""
        return self.services == "postgres"


@contextmanager
def database(work: Path, o: StackOptions) -> Iterator[tuple[str, str]]:
    """A fresh database for one run, migrated, with an API key; yields (URL, key). PostgreSQL:
    a scratch database, dropped on exit; local: a SQLite file in `work`."""
    from orchestrator.auth import create_api_key
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    with _database_url(work, o) as url:
        engine = make_engine(url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            key = create_api_key(conn, "traces").key
        engine.dispose()
        yield url, key


@contextmanager
def _database_url(work: Path, o: StackOptions) -> Iterator[str]:
    if o.services == "local":
        yield f"sqlite:///{work / 'traces.db'}"
        return
    from benchmarks.ingest_kafka import scratch_database  # psycopg and kafka: PostgreSQL runs only

    with scratch_database() as url:
        yield url


def _service_env(db_url: str, work: Path, o: StackOptions) -> dict[str, str]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DAYZERO_", "CELERY_", "KAFKA_"))},
        # this checkout first; the caller's entries kept (a GPU host's carried wheels, /tmp/site)
        "PYTHONPATH": os.pathsep.join([str(REPO), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]),
        "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1",
        "DATABASE_URL": db_url,
        "DAYZERO_BLOB_DIR": str(work / "blobs"), "DAYZERO_WORKSPACE_DIR": str(work / "ws"),
        "DAYZERO_POLL_INTERVAL_S": "0.05", "DAYZERO_BUDGET_MAX_STEPS": "100000",
        "DAYZERO_BUDGET_MAX_TOKENS": "2000000000", "DAYZERO_BUDGET_DEADLINE_S": "86400",
        # the cold-prefill baseline submits a long fresh prompt in one body (up to ~8 MB of text)
        "DAYZERO_INGRESS_MAX_BODY_BYTES": str(64 * 1024 * 1024),
    }  # fmt: skip
    if o.celery:
        broker = f"redis://127.0.0.1:6379/{o.redis_db}"
        env |= {"CELERY_BROKER_URL": broker, "CELERY_RESULT_BACKEND": broker}
    return env


@contextmanager
def stack(db_url: str, work: Path, o: StackOptions) -> Iterator[tuple[str, Any]]:
    """Start the services; yields (API base URL, the proxy)."""
    s = Stack(work, _service_env(db_url, work, o))
    port = free_port()
    infer = f"http://127.0.0.1:{port}"
    source = ["--model", o.model] if o.model else ["--dummy", *([o.dummy_config] if o.dummy_config else [])]
    try:
        s.start("inference", "infer", "serve", *source, "--port", str(port), "--device", o.device,
                "--served-model-name", "trace", "--max-model-len", str(o.max_model_len), *o.infer_args)  # fmt: skip
        api_port = free_port()
        s.start("api", "serve", "--port", str(api_port), "--log-level", "warning")
        wport = free_port()
        if o.celery:
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
            if o.celery:
                s.wait_http("worker", f"http://127.0.0.1:{wport}/metrics")
            yield api, proxy
    finally:
        s.stop()

"""Outages of the model server and of the Celery broker under a running runner (issue 39, items
2 and 3): both are waited out like the database's; no task fails and no runner exits for them.

Everything is real: the scripted model server and a Redis server are processes of their own,
SIGKILLed and started again on the same port; the tool runs on a real Celery worker."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from orchestrator.dispatch import CeleryDispatcher, InProcessDispatcher
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import get_task, list_attempts
from testing.celery_test_app import build_app
from testing.kafka_broker import free_port
from tests.orchestrator.conftest import submit, wait_until
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry

REPO = Path(__file__).resolve().parents[2]
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT")


class _Server:
    """A server process on a fixed port, killed with SIGKILL and started again on that port."""

    def __init__(self, cmd: list[str], port: int, log: Path):
        self.cmd, self.port, self.log = cmd, port, log
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, stdout=out, stderr=out
            )
        wait_until(self._listening, 30, f"{self.cmd[0]} on port {self.port}")

    def _listening(self) -> bool:
        import socket

        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)


@pytest.fixture
def servers() -> Iterator[list[_Server]]:
    made: list[_Server] = []
    yield made
    for s in made:
        s.kill()


def _registry() -> Any:
    return build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))


def _runner(db: Engine, client: Any, dispatcher: Any, registry: Any, tmp_path: Path) -> Runner:
    cfg = RunnerConfig(
        lease_s=5.0, poll_interval_s=0.02, workspace_dir=str(tmp_path / "ws"), blob_url=str(tmp_path / "b")
    )
    return Runner(db, client, dispatcher, registry, cfg)


def _status(db: Engine, task_id: str) -> str:
    with db.connect() as conn:
        return get_task(conn, task_id).status


def test_a_model_server_restart_is_waited_out(db, state_dir, tmp_path, servers):
    # Before: the model step had 3 attempts within ~1.5 s, so a SIGKILLed server that took a few
    # seconds to come back failed every task with a step in flight.
    port = free_port()
    model = _Server([sys.executable, "-m", "testing.scripted_model", str(port)], port, tmp_path / "m.log")
    servers.append(model)
    model.start()
    registry = _registry()
    runners, threads = [], []
    for _ in range(3):
        # The base URL as OpenAI clients are configured, with `/v1` (before: 404).
        client = OpenAIChatClient(f"http://127.0.0.1:{port}/v1", "scripted", timeout_s=60)
        r = _runner(db, client, InProcessDispatcher(registry), registry, tmp_path)
        runners.append(r)
        threads.append(threading.Thread(target=r.run_forever, daemon=True))
    ids = [submit(db, {"cycles": 1, "tool": "echo", "sleep_s": 1.5}) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: all(_status(db, i) == "RUNNING" for i in ids), 60, "every task to start")
        time.sleep(0.5)  # inside the server's 1.5 s answer: every model call is in flight
        model.kill()
        wait_until(
            lambda: all(not r.health.ready and r.health.reason.startswith("inference") for r in runners),
            60,
            "every runner to report the model server unavailable",
        )
        time.sleep(3)  # a server that takes seconds to come back
        assert all(_status(db, i) == "RUNNING" for i in ids)
        model.start()
        wait_until(lambda: all(_status(db, i) in TERMINAL for i in ids), 120, "every task to finish")
    finally:
        for r in runners:
            r.stop()
        for t in threads:
            t.join(30)
    with db.connect() as conn:
        tasks = [get_task(conn, i) for i in ids]
    assert [(t.status, t.result) for t in tasks] == [("SUCCEEDED", "done after 1 tool calls")] * 3
    assert all(r.health.ready for r in runners)


def _start_tools_worker(redis_url: str, prefix: str, log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "DZ_TEST_PREFIX": prefix, "CELERY_BROKER_URL": redis_url,
           "CELERY_RESULT_BACKEND": redis_url, "DAYZERO_TOOL_MODULES": "testing.fixture_tools"}  # fmt: skip
    cmd = [sys.executable, "-m", "celery", "-A", "testing.celery_test_app", "worker", "--queues", "tools",
           "--pool", "solo", "--loglevel", "INFO", "--hostname", f"w-{prefix}@%h",
           "--without-gossip", "--without-mingle", "--without-heartbeat"]  # fmt: skip
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True
    )
    wait_until(
        lambda: b" ready." in log.read_bytes() or proc.poll() is not None, 60, "the worker to start"
    )  # the state dir comes from the environment (`state_dir`)
    assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
    return proc


def test_a_celery_broker_blip_is_waited_out_and_the_tool_runs_once(
    db, state_dir, tmp_path, servers, model_server
):
    # Before: send_task raised kombu's OperationalError, which was no outage error: run_forever
    # exited 1, and on resume the tool that was never sent was recorded LOST "outcome unknown".
    port = free_port()
    redis_srv = _Server(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        port,
        tmp_path / "redis.log",
    )
    servers.append(redis_srv)
    redis_srv.start()
    url = f"redis://127.0.0.1:{port}/0"
    prefix = f"dzblip-{uuid.uuid4().hex[:8]}-"
    worker = _start_tools_worker(url, prefix, tmp_path / "worker.log")
    registry = _registry()
    dispatcher = CeleryDispatcher(url, url, app=build_app(url, url, prefix))
    client = OpenAIChatClient(model_server.url, "scripted", timeout_s=30)
    runner = _runner(db, client, dispatcher, registry, tmp_path)
    exited: list[BaseException] = []

    def run() -> None:
        try:
            runner.run_forever()
        except BaseException as exc:  # what ended the runner, for the assertion below
            exited.append(exc)

    try:
        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        first = submit(db, {"cycles": 1, "tool": "remit"})  # the dispatcher's connections are made
        wait_until(lambda: _status(db, first) in TERMINAL, 60, "the first task to finish")
        redis_srv.kill()
        task_id = submit(db, {"cycles": 1, "tool": "remit"})
        wait_until(lambda: _status(db, task_id) == "RUNNING", 30, "the task to start")
        time.sleep(4)  # the tool step is trying to send meanwhile
        assert thread.is_alive(), f"the runner exited: {exited!r}"
        redis_srv.start()
        wait_until(
            lambda: _status(db, task_id) in TERMINAL or not thread.is_alive(), 120, "the task to finish"
        )
        assert not exited, exited
        with db.connect() as conn:
            task = get_task(conn, task_id)
            attempts = [a for a in list_attempts(conn, task_id) if a.step_index == 1]
    finally:
        runner.stop()
        dispatcher.close()
        client.close()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
    assert (task.status, task.result) == ("SUCCEEDED", "done after 1 tool calls")
    assert [a.status for a in attempts] == ["SUCCEEDED"], attempts
    assert (state_dir / "remits.log").read_text().split() == [f"{first}:1:1", f"{task_id}:1:1"]


def test_a_revoked_job_is_a_failed_attempt_not_a_runner_crash(tmp_path, state_dir):
    # Found by the soak with Redis restarts: a job that expired in the queue (the broker was away
    # past its deadline) comes back as TaskRevokedError from the result, which ended the runner.
    from core.payloads import ToolJob
    from tests.workers.conftest import REDIS_URL

    prefix = f"dzrevoke-{uuid.uuid4().hex[:8]}-"
    worker = _start_tools_worker(REDIS_URL, prefix, tmp_path / "worker.log")
    dispatcher = CeleryDispatcher(REDIS_URL, REDIS_URL, app=build_app(REDIS_URL, REDIS_URL, prefix))
    try:
        job = ToolJob(
            tool="echo", arguments="{}", task_id="t", step_index=1, attempt=1, idempotency_key="t:1:1",
            timeout_s=30.0, not_after=time.time() - 60,  # expired before any worker sees it
        )  # fmt: skip
        outcome = dispatcher.run_tool(job)
    finally:
        dispatcher.close()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
    assert outcome["ok"] is False and outcome["error"]["kind"] == "retryable", outcome
    assert "revoked" in outcome["error"]["error"]


def test_a_cancel_stops_the_wait_for_a_celery_job_and_revokes_it(tmp_path, state_dir):
    # Cancellation (issue 39, item 7) through Celery: the dispatcher stops waiting at once and
    # revokes the job; the tool here would never end by itself (its gate is never opened).
    from core.payloads import ToolJob
    from tests.workers.conftest import REDIS_URL

    prefix = f"dzcancel-{uuid.uuid4().hex[:8]}-"
    worker = _start_tools_worker(REDIS_URL, prefix, tmp_path / "worker.log")
    dispatcher = CeleryDispatcher(REDIS_URL, REDIS_URL, app=build_app(REDIS_URL, REDIS_URL, prefix))
    cancel = threading.Event()
    try:
        job = ToolJob(
            tool="gate", arguments="{}", task_id="t", step_index=1, attempt=1, idempotency_key="t:1:1",
            timeout_s=60.0, not_after=time.time() + 60,
        )  # fmt: skip
        threading.Timer(1.0, cancel.set).start()
        t0 = time.monotonic()
        outcome = dispatcher.run_tool(job, cancel=cancel)
        took = time.monotonic() - t0
    finally:
        dispatcher.close()
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(30)
    print(f"Celery job: cancel -> dispatcher returned after {took - 1.0:.2f} s")
    assert outcome.get("cancelled") is True, outcome
    assert took < 55  # the job itself would have run for the full minute

"""Fixtures for runner tests: a scripted model over real HTTP, test tools, a runner factory."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import Engine

from orchestrator.config import Budgets
from orchestrator.dispatch import InProcessDispatcher
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import NewTask, create_task
from testing.scripted_model import ScriptedModelServer
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as srv:
        yield srv


@pytest.fixture
def state_dir(tmp_path, monkeypatch):
    d = tmp_path / "state"
    d.mkdir()
    monkeypatch.setenv("DAYZERO_TEST_STATE_DIR", str(d))
    return d


@pytest.fixture
def make_runner(db: Engine, model_server, state_dir, tmp_path) -> Iterator[Any]:
    made: list[tuple[Runner, Any, Any]] = []

    def factory(**cfg: Any) -> Runner:
        registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
        client = OpenAIChatClient(model_server.url, "scripted", timeout_s=10)
        dispatcher = InProcessDispatcher(registry)
        cfg.setdefault("lease_s", 5.0)
        cfg.setdefault("poll_interval_s", 0.02)
        cfg.setdefault("workspace_dir", str(tmp_path / "ws"))
        cfg.setdefault("blob_url", str(tmp_path / "blobs"))
        runner = Runner(db, client, dispatcher, registry, RunnerConfig(**cfg))
        made.append((runner, client, dispatcher))
        return runner

    yield factory
    for runner, client, dispatcher in made:
        runner.stop()
        client.close()
        dispatcher.close()


def submit(db: Engine, script: dict[str, Any], **kw: Any) -> str:
    with db.begin() as conn:
        task_id, _ = create_task(
            conn, NewTask(tenant=kw.pop("tenant", "t1"), goal="script:" + json.dumps(script), **kw), Budgets()
        )
    return task_id


def wait_until(cond: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `cond` until it is true; AssertionError naming `what` after `timeout_s`."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")

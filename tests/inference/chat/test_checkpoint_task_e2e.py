"""A checkpoint folder served as released (`dayzero infer serve --model` the bundled demo checkpoint:
`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`, `chat_template.jinja`) drives
an orchestrator task end to end: a REST submission, the model's tool call parsed by the family's
parser, the tool's result, the answer."""

from __future__ import annotations

import httpx
from fastapi.testclient import TestClient

from inference.demo_model.spec import DEMO_DIR
from testing.inference_server import served


def test_a_rest_task_calls_a_tool_and_answers_through_the_served_checkpoint(tmp_path):
    from orchestrator.api import create_app
    from orchestrator.auth import create_api_key
    from orchestrator.config import Settings
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine
    from orchestrator.dispatch import InProcessDispatcher
    from orchestrator.inference_client import OpenAIChatClient
    from orchestrator.runner import Runner, RunnerConfig
    from orchestrator.tasks.queries import get_task, list_messages
    from tools.config import ToolsConfig
    from workers.tool_jobs import build_registry

    url = f"sqlite:///{tmp_path / 'dayzero.db'}"
    db = make_engine(url)
    migrate.upgrade(db)
    with db.begin() as conn:
        key = create_api_key(conn, "acme").key
    with served(["--model", str(DEMO_DIR)], log=tmp_path / "serve.log") as server:
        name = httpx.get(server + "/v1/models").json()["data"][0]["id"]
        assert name == "dayzero-demo"  # the checkpoint config's own name
        app = create_app(Settings(DATABASE_URL=url, DAYZERO_BLOB_DIR=str(tmp_path / "blobs")), engine=db)
        with TestClient(app) as api:
            r = api.post(
                "/v1/tasks",
                json={"goal": "What is 17 * 23?", "allowed_tools": ["calculator"]},
                headers={"Authorization": f"Bearer {key}"},
            )
            assert r.status_code == 201, r.text
            task_id = r.json()["id"]
        registry = build_registry(ToolsConfig(skip_unavailable=True, modules=()))
        client = OpenAIChatClient(server, name, timeout_s=120)
        dispatcher = InProcessDispatcher(registry)
        config = RunnerConfig(
            poll_interval_s=0.02, workspace_dir=str(tmp_path / "ws"), blob_url=str(tmp_path / "blobs")
        )
        runner = Runner(db, client, dispatcher, registry, config)
        try:
            runner.run_until_idle(timeout_s=180)
        finally:
            runner.stop()
            client.close()
            dispatcher.close()
    with db.connect() as conn:
        task = get_task(conn, task_id)
        messages = list_messages(conn, task_id)
    db.dispose()
    calls = [c for m in messages if m["role"] == "assistant" for c in m.get("tool_calls") or []]
    assert task.status == "SUCCEEDED", (task.status, task.error, messages)
    assert calls and calls[0]["function"]["name"] == "calculator"
    assert any(m["role"] == "tool" and "391" in str(m["content"]) for m in messages)
    assert "391" in task.result and "<|" not in task.result

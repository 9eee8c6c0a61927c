"""The OpenAI-compatible client against real local HTTP servers that misbehave, and the runner's
handling of model failures (retried when transient, the task fails when permanent)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from orchestrator.dispatch import InProcessDispatcher
from orchestrator.inference_client import InferenceError, OpenAIChatClient, Sampling, parse_chat_completion
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import get_task, list_attempts
from testing.scripted_model import reply
from tests.orchestrator.conftest import submit
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry


class _FlakyServer:
    """Answers with `failures` (status, body) first, then like the scripted model."""

    def __init__(self, failures: list[tuple[int, bytes]]):
        self.failures = list(failures)
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if outer.failures:
                    code, out = outer.failures.pop(0)
                else:
                    code, out = 200, json.dumps(reply(body["messages"])).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def flaky():
    servers: list[_FlakyServer] = []

    def make(failures):
        servers.append(_FlakyServer(failures))
        return servers[-1]

    yield make
    for s in servers:
        s.close()


MSGS = [{"role": "user", "content": "script:" + json.dumps({"cycles": 1, "tool": "echo"})}]


def test_client_reads_tool_calls_and_usage(flaky):
    client = OpenAIChatClient(flaky([]).url, "m")
    turn = client.chat(MSGS, [], Sampling())
    assert turn.tool_calls[0].name == "echo" and json.loads(turn.tool_calls[0].arguments) == {"i": 0}
    assert turn.usage.prompt_tokens > 0 and turn.usage.cached_tokens >= 0 and turn.usage.ttft_ms > 0
    client.close()


@pytest.mark.parametrize(
    ("status", "body", "retryable"),
    [
        (503, b"overloaded", True),
        (429, b"slow down", True),
        (400, b'{"error": "bad"}', False),
        (200, b"<html>", True),
    ],
    ids=["503", "429", "400", "not-json"],
)
def test_client_classifies_failures(flaky, status, body, retryable):
    client = OpenAIChatClient(flaky([(status, body)]).url, "m")
    with pytest.raises(InferenceError) as exc:
        client.chat(MSGS, [], Sampling())
    assert exc.value.retryable is retryable
    client.close()


def test_unreachable_server_is_retryable():
    client = OpenAIChatClient("http://127.0.0.1:9", "m", timeout_s=2)
    with pytest.raises(InferenceError) as exc:
        client.chat(MSGS, [], Sampling())
    assert exc.value.retryable


def test_broken_tool_call_shapes_are_kept_for_the_registry_to_reject():
    body = {
        "choices": [
            {
                "message": {
                    "role": "assistant",
                    "tool_calls": [{"id": "a", "function": {"arguments": {"x": 1}}}, {}],
                },
                "finish_reason": "tool_calls",
            }
        ]
    }
    turn = parse_chat_completion(body, 1.0)
    assert [(c.name, c.arguments) for c in turn.tool_calls] == [("", '{"x": 1}'), ("", "")]


def _runner(db, url: str) -> tuple[Runner, Any, Any]:
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=("testing.fixture_tools",)))
    client = OpenAIChatClient(url, "m")
    dispatcher = InProcessDispatcher(registry)
    policy = RunnerConfig().model_retry
    cfg = RunnerConfig(
        poll_interval_s=0.02,
        model_retry=type(policy)(max_attempts=3, backoff_base_s=0.05, backoff_max_s=0.1, timeout_s=10),
    )
    return Runner(db, client, dispatcher, registry, cfg), client, dispatcher


def test_transient_model_failures_are_retried(db, flaky):
    server = flaky([(500, b"oops"), (500, b"oops")])
    task_id = submit(db, {"cycles": 1, "tool": "echo"})
    runner, client, dispatcher = _runner(db, server.url)
    runner.run_until_idle(timeout_s=30)
    client.close()
    dispatcher.close()
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
        first = [a.status for a in list_attempts(conn, task_id) if a.step_index == 0]
    assert first == ["FAILED", "FAILED", "SUCCEEDED"]


def test_an_unavailable_model_server_is_waited_out_without_spending_attempts(db, flaky):
    # 503/429 say "not now" (starting, restarting, overloaded): an outage, not a failed attempt.
    # Before: five 503s in a row spent the step's three attempts and failed the task.
    server = flaky([(503, b"starting")] * 4 + [(429, b"slow down")])
    task_id = submit(db, {"cycles": 1, "tool": "echo"})
    runner, client, dispatcher = _runner(db, server.url)
    runner.run_until_idle(timeout_s=120)
    client.close()
    dispatcher.close()
    with db.connect() as conn:
        assert get_task(conn, task_id).status == "SUCCEEDED"
        first = [a.status for a in list_attempts(conn, task_id) if a.step_index == 0]
    assert first == ["SUCCEEDED"]


def test_permanent_model_failure_fails_the_task(db, flaky):
    server = flaky([(400, b'{"error": {"message": "context too long"}}')])
    task_id = submit(db, {"cycles": 1})
    runner, client, dispatcher = _runner(db, server.url)
    runner.run_until_idle(timeout_s=30)
    client.close()
    dispatcher.close()
    with db.connect() as conn:
        task = get_task(conn, task_id)
    assert (
        task.status == "FAILED"
        and task.error["kind"] == "inference"
        and "context too long" in task.error["message"]
    )


def test_a_prompt_over_the_models_context_fails_the_task_typed(db, flaky):
    """The server's 400 `context_length_exceeded` is the task's `context_exceeded`, not retried."""
    body = b'{"error": {"message": "prompt of 9000 tokens, context 8192", "code": "context_length_exceeded"}}'
    server = flaky([(400, body)])
    task_id = submit(db, {"cycles": 1})
    runner, client, dispatcher = _runner(db, server.url)
    runner.run_until_idle(timeout_s=30)
    client.close()
    dispatcher.close()
    with db.connect() as conn:
        task = get_task(conn, task_id)
        attempts = [a.status for a in list_attempts(conn, task_id) if a.step_index == 0]
    assert task.status == "FAILED" and task.error["kind"] == "context_exceeded", task.error
    assert "9000 tokens" in task.error["message"] and attempts == ["FAILED"]

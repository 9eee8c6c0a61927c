"""The agent-trace benchmark's path at a small size, as a test of exactness (never of timings):
runners drive scripted multi-turn tasks (several at once, sharing a system prompt) through our
inference server with random weights (`dayzero infer serve --dummy`) behind the benchmark's
scripted proxy. Every turn after a task's first goes on the wire incrementally, its prompt has
exactly the tokens of a full render of the transcript (`/tokenize`, no key), and the prefix cache
reuses at least 95% of the ideal (the previous turn's whole prompt)."""

from __future__ import annotations

import json
import threading

import httpx
import pytest

from benchmarks.agent_traces import turn_rows
from benchmarks.trace_script import ScriptedProxy, TraceSpec, document
from orchestrator.api.views import task_detail
from orchestrator.config import Budgets
from orchestrator.dispatch import InProcessDispatcher
from orchestrator.inference_client import OpenAIChatClient
from orchestrator.runner import Runner, RunnerConfig
from orchestrator.store import NewTask, create_task, get_task, list_attempts, list_messages, list_steps
from testing.inference_server import served
from tools.config import ToolsConfig
from workers.tool_jobs import build_registry

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def dummy_server(tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    with served(
        ["--dummy", "--max-model-len", "65536", "--num-blocks", "2048", "--max-num-seqs", "8"], log=log
    ) as url:
        yield url


def test_incremental_turns_are_exact_and_reuse_the_cache(db, dummy_server, tmp_path):
    if db.dialect.name != "postgresql":
        pytest.skip("one database suffices: the path under test is the wire and the server's")
    specs = [TraceSpec((1, 2, 1, 3)), TraceSpec((2, 1, 2)), TraceSpec((1, 1, 1, 1))]
    system = "Shared reference.\n" + document("system", 0, 2)
    ids = []
    with db.begin() as conn:
        for spec in specs:
            goal = "trace:" + '{"docs_kb": ' + str(list(spec.docs_kb)) + "}"
            task_id, _ = create_task(
                conn,
                NewTask(
                    tenant="t", goal=goal, system_prompt=system, allowed_tools=["workspace_write", "workspace_read"],
                    sampling={"max_tokens": 1, "temperature": 0}, max_steps=100,
                ),
                Budgets(),
            )  # fmt: skip
            ids.append(task_id)
    registry = build_registry(ToolsConfig(skip_unavailable=True))
    with ScriptedProxy(dummy_server) as proxy:
        runners = []
        for _ in specs:  # one runner per task: the tasks run at once
            client = OpenAIChatClient(proxy.url, "dayzero-small-random", timeout_s=300)
            cfg = RunnerConfig(
                lease_s=30,
                poll_interval_s=0.05,
                workspace_dir=str(tmp_path / "ws"),
                blob_url=str(tmp_path / "b"),
            )
            runners.append(Runner(db, client, InProcessDispatcher(registry), registry, cfg))
        threads = [threading.Thread(target=r.run_until_idle, kwargs={"timeout_s": 600}) for r in runners]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    tools = runners[0].tools.openai_tools(["workspace_write", "workspace_read"])
    with db.connect() as conn:
        details = [
            task_detail(get_task(conn, tid), None, list_steps(conn, tid), list_attempts(conn, tid))
            for tid in ids
        ]
        transcripts = [list_messages(conn, tid) for tid in ids]
    for spec, detail, transcript in zip(specs, details, transcripts, strict=True):
        task = detail.model_dump(mode="json")
        assert task["status"] == "SUCCEEDED", task.get("error")
        rows = turn_rows(task)
        assert len(rows) == spec.turns
        assert rows[0]["wire"] == "full:no_base"
        assert all(r["wire"] == "incremental" for r in rows[1:]), [r["wire"] for r in rows]
        # each prompt's length is a full render's of the transcript the turn saw
        assistant = [i for i, m in enumerate(transcript) if m["role"] == "assistant"]
        for r, cut in zip(rows, assistant, strict=True):
            full = httpx.post(
                dummy_server + "/tokenize", json={"messages": transcript[:cut], "tools": tools}, timeout=60
            ).json()
            assert r["prompt_tokens"] == full["count"], r["turn"]
            if r["turn"] >= 2:  # only the new messages went on the wire
                whole = len(json.dumps(transcript[:cut], ensure_ascii=False).encode())
                assert r["request_bytes"] < whole, (r["turn"], r["request_bytes"], whole)
        later = rows[1:]
        share = sum(min(r["cached_tokens"], r["ideal_cached_tokens"]) for r in later) / sum(
            r["ideal_cached_tokens"] for r in later
        )
        assert share >= 0.95, [(r["cached_tokens"], r["ideal_cached_tokens"]) for r in later]
    for r in runners:
        r.stop()
        r.inference.close()
        r.dispatcher.close()


@pytest.mark.parametrize("target", [16384, 65536])
def test_host_only_traces_end_near_their_target_size(target):
    """A trace sized for `target` tokens ends within 10% of it (the system prompt counted, the
    write results as the workspace tool returns them), and every turn after the first goes on the
    wire incrementally."""
    from benchmarks.trace_host import host_only

    system = "Shared reference.\n" + document("system", 0, 4)
    spec = TraceSpec.growing_to(target, 0, 1.0, 101, len(system.encode()) + 64)  # byte tokenizer
    rows = host_only([spec], system, None, "incremental")[0]["turns"]
    assert 0.9 * target <= rows[-1]["prompt_tokens"] <= 1.1 * target, rows[-1]["prompt_tokens"]
    assert [r["wire"] for r in rows[1:]] == ["incremental"] * (len(rows) - 1)

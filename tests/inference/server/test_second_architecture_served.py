"""The new architectures served for real: `dayzero infer serve --dummy tiny_deepseek_v32.json`
(and `tiny_qwen3_next.json`) in its own process, its greedy completions equal to transformers'
`DeepseekV32ForCausalLM` (`Qwen3NextForCausalLM`) on the same seeded weights, and an orchestrator
task (real runner, real HTTP client, SQLite) whose model steps that server answers."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
import torch

from inference.config import load_config
from inference.model import build_model
from inference.tokenizer import ByteTokenizer
from testing import deepseek_hf_mapping, qwen3_next_hf_mapping
from testing.inference_server import served

# architecture -> (its mapping helpers, transformers' model class)
ARCHS = {
    "deepseek_v32": (deepseek_hf_mapping, "DeepseekV32ForCausalLM"),
    "qwen3_next": (qwen3_next_hf_mapping, "Qwen3NextForCausalLM"),
}


@pytest.fixture(scope="module", params=sorted(ARCHS))
def arch(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(arch, tmp_path_factory) -> Iterator[str]:
    tiny = ARCHS[arch][0].TINY
    args = ["--dummy", str(tiny), "--device", "cpu", "--block-size", "8", "--checkpoint-interval", "16",
            "--num-blocks", "512", "--max-model-len", "4096"]  # fmt: skip
    with served(args, log=tmp_path_factory.mktemp("serve") / "serve.log", timeout_s=120) as url:
        yield url


@pytest.fixture(scope="module")
def reference(arch):
    """transformers' model holding the weights the server built (`--seed 0`)."""
    import json

    import transformers

    mapping, cls = ARCHS[arch]
    ours = build_model(load_config(mapping.TINY), seed=0)
    hf = getattr(transformers, cls)(mapping.hf_config(json.loads(mapping.TINY.read_text()))).eval()
    hf.load_state_dict(mapping.published_to_hf(ours.state_dict()), strict=True)
    return hf


@torch.no_grad()
def _hf_greedy(hf, ids: list[int], n: int, vocab: int) -> tuple[list[int], list[float]]:
    """Full causal forwards (no KV cache), argmax over the tokenizer's ids as the engine samples;
    (tokens, their log-probabilities over those ids)."""
    out, lps = list(ids), []
    for _ in range(n):
        logp = hf(torch.tensor([out])).logits[0, -1, :vocab].log_softmax(-1)
        out.append(int(logp.argmax()))
        lps.append(float(logp.max()))
    return out[len(ids) :], lps


def test_served_completions_equal_transformers(server, reference):
    tok = ByteTokenizer()
    prompts = ["Day-0 adaptation: a new architecture from the shared layers", "x" * 30]
    for prompt in prompts:  # twice each: the second call is a prefix-cache hit
        ids = tok.encode(prompt)
        want, want_lps = _hf_greedy(reference, ids, 12, tok.vocab_size)
        for _ in range(2):
            r = httpx.post(
                server + "/v1/completions",
                json={"prompt": ids, "max_tokens": 12, "temperature": 0, "ignore_eos": True, "logprobs": 0},
                timeout=60,
            )
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["usage"]["completion_tokens"] == 12
            # token by token (the text alone can hide a difference: invalid UTF-8 bytes of a
            # random model decode to U+FFFD, and a stop token is not text)
            lp = body["choices"][0]["logprobs"]
            assert lp["tokens"] == [tok.decode([t]) for t in want]
            assert lp["token_logprobs"] == pytest.approx(want_lps, abs=1e-4)
    second = httpx.post(
        server + "/v1/completions",
        json={"prompt": tok.encode(prompts[0]), "max_tokens": 1, "temperature": 0},
        timeout=60,
    ).json()
    assert second["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0) > 0


def test_orchestrator_task_runs_on_the_served_model(server, tmp_path):
    from orchestrator.config import Budgets
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine
    from orchestrator.dispatch import InProcessDispatcher
    from orchestrator.inference_client import OpenAIChatClient, Sampling, chat_request_body
    from orchestrator.runner import Runner, RunnerConfig
    from orchestrator.store import NewTask, create_task, get_task, list_messages
    from tools.config import ToolsConfig
    from workers.tool_jobs import build_registry

    db = make_engine(f"sqlite:///{tmp_path / 'dayzero.db'}")
    migrate.upgrade(db)
    name = httpx.get(server + "/v1/models").json()["data"][0]["id"]
    registry = build_registry(ToolsConfig(skip_unavailable=True, modules=()))
    client = OpenAIChatClient(server, name, timeout_s=60)
    dispatcher = InProcessDispatcher(registry)
    runner = Runner(db, client, dispatcher, registry, RunnerConfig(poll_interval_s=0.02, workspace_dir=str(tmp_path / "ws"),
                                                                   blob_url=str(tmp_path / "blobs")))  # fmt: skip
    try:
        with db.begin() as conn:
            task_id, _ = create_task(
                conn,
                NewTask(tenant="t1", goal="Summarise the Day-0 method.", sampling={"max_tokens": 16}),
                Budgets(),
            )
        runner.run_until_idle(timeout_s=120)
        with db.connect() as conn:
            task = get_task(conn, task_id)
            messages = list_messages(conn, task_id)
    finally:
        runner.stop()
        client.close()
        dispatcher.close()
        db.dispose()
    assert task.status in ("SUCCEEDED", "FAILED"), task.status
    assert task.prompt_tokens > 0 and task.completion_tokens > 0  # the served model answered
    # the transcript's model turn is what the server answers greedily for the same request
    # (the runner's messages up to that turn, its tool list, its sampling)
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    body = chat_request_body(name, messages[:first], registry.openai_tools(None), Sampling(max_tokens=16))
    again = httpx.post(server + "/v1/chat/completions", json=body, timeout=60).json()
    assert again["choices"][0]["message"].get("content") == messages[first].get("content")
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] > 0  # the prompt resumed from the cache

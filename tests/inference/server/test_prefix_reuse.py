"""Prefix reuse seen from the OpenAI server: every shared token of a prompt is reused, exactly.

The three cases of a serving workload, each through real HTTP: the same request sent again, a long
shared system prompt followed by different user messages, and the next agent turn re-sending the
transcript. Each answer is compared with a server that has the prefix cache off (fp32, greedy)."""

import httpx
import pytest
import torch

from inference.chat import engine_frontend
from inference.embedded import EMBEDDED_ENGINE_CONFIG
from inference.engine.factory import build_engine
from inference.server.serve import BackgroundServer

MODEL = "tiny"
BLOCK = 16
# The server's default interval: interval checkpoints alone would reuse a 3,077-token system
# prompt only up to 3,072 - and a 1,829-token repeat not at all.
CONFIG = EMBEDDED_ENGINE_CONFIG.evolve(
    block_size=BLOCK, checkpoint_interval=1024, max_model_len=8192, num_blocks=2048
)


@pytest.fixture(scope="module")
def servers():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    cached = BackgroundServer(build_engine(engine_config=CONFIG), model_name=MODEL)
    plain = BackgroundServer(
        build_engine(engine_config=CONFIG.evolve(enable_prefix_caching=False)), model_name=MODEL
    )
    with cached, plain, httpx.Client(timeout=120) as client:

        def ask(messages, *, server=cached, **extra):
            body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0, **extra}
            r = client.post(f"{server.url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        def ask_both(messages, **extra):
            a = ask(messages, **extra)
            assert a["choices"] == ask(messages, server=plain, **extra)["choices"]  # reuse is exact
            return a

        yield cached, ask_both
    torch.set_num_threads(n)


def cached_tokens(resp) -> int:
    return resp["usage"]["prompt_tokens_details"]["cached_tokens"]


def text(n: int, seed: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    out, i = [], seed
    while sum(len(w) + 1 for w in out) < n:
        out.append(words[(i * 7 + 3) % len(words)])
        i += 1
    return " ".join(out)[:n]


def test_the_same_request_twice_reuses_all_but_one_block(servers):
    _, ask = servers
    messages = [{"role": "user", "content": text(1800, 1)}]
    first = ask(messages)
    n = first["usage"]["prompt_tokens"]
    assert n > 1800 and cached_tokens(first) == 0
    again = ask(messages)
    assert cached_tokens(again) >= n - BLOCK  # before: 0 (the prompt-end checkpoint is one too deep)


def test_a_shared_system_prompt_is_reused_whole(servers):
    cached, ask = servers
    system = {"role": "system", "content": text(3070, 2)}
    system_end = len(
        engine_frontend(cached.engine.engine).renderer.render([system], add_generation_prompt=False).token_ids
    )
    assert system_end > 3072  # past the last interval checkpoint, so only a message-end checkpoint serves
    ask([system, {"role": "user", "content": "first question"}])
    other = ask([system, {"role": "user", "content": "a different question"}])
    assert cached_tokens(other) >= system_end  # before: 3,072 (the last interval multiple)


def test_the_next_agent_turn_resumes_from_the_whole_transcript(servers):
    _, ask = servers
    messages = [{"role": "system", "content": text(700, 3)}, {"role": "user", "content": "go"}]
    turn1 = ask(messages)
    transcript = turn1["usage"]["prompt_tokens"] + turn1["usage"]["completion_tokens"]
    messages += [turn1["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    turn2 = ask(messages)
    # All but the last sampled token, when the reply re-renders to the tokens the model sampled
    # (byte tokenizer: one token a byte); random weights emit special tokens that the returned
    # text drops, so then the prompt's end.
    content = turn1["choices"][0]["message"]["content"] or ""
    if (
        content
        and "\ufffd" not in content
        and len(content.encode()) >= turn1["usage"]["completion_tokens"] - 1
    ):
        assert cached_tokens(turn2) >= transcript - 1
    assert cached_tokens(turn2) >= turn1["usage"]["prompt_tokens"]


def test_keyed_agent_turns_copy_the_previous_turns_block_keys(servers):
    """With a `prompt_cache_key`, the server tells the engine which kept ids a turn extends: the
    engine copies the previous turn's block keys (not rebuilt) and the answers stay exact."""
    cached, ask = servers
    kept = cached.engine.engine.scheduler.cache.kept
    messages = [{"role": "system", "content": text(900, 4)}, {"role": "user", "content": "go"}]
    before = kept.reused
    prev = None
    for turn in range(3):
        resp = ask(messages, prompt_cache_key="keyed-turns")
        if prev is not None:
            assert cached_tokens(resp) >= prev["usage"]["prompt_tokens"] - BLOCK
        prev = resp
        messages += [resp["choices"][0]["message"], {"role": "user", "content": f"and then {turn}?"}]
    assert kept.reused - before >= 2 * (900 // BLOCK)  # turns 2 and 3 copied the transcript's keys
    assert kept.refused == 0

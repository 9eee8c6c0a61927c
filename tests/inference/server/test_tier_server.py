"""A conversation evicted to the disk tier and resumed through the OpenAI server: the returning
turn reports its transcript as cached tokens and answers exactly what a server without offload
(and without a cache hit) answers. CPU, fp32, greedy, tiny GPU pools that force eviction."""

import httpx
import pytest
import torch

from inference.cache.tiers import TierConfig
from inference.embedded import EMBEDDED_ENGINE_CONFIG
from inference.engine.factory import build_engine
from inference.server.serve import BackgroundServer

MODEL = "tiny"
CONFIG = EMBEDDED_ENGINE_CONFIG.evolve(
    block_size=16, num_blocks=48, num_state_slots=8, max_num_seqs=2, max_model_len=768, checkpoint_interval=64
)


def text(n: int, seed: int) -> str:
    words = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "theta"]
    return " ".join(words[(seed * 5 + i * 3) % len(words)] for i in range(n // 6))[:n]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    disk = tmp_path_factory.mktemp("kv-disk")
    tiered = build_engine(
        engine_config=CONFIG.evolve(tiers=TierConfig(disk_bytes=64 << 20, disk_url=str(disk)))
    )
    plain = build_engine(engine_config=CONFIG)
    with (
        BackgroundServer(tiered, model_name=MODEL) as a,
        BackgroundServer(plain, model_name=MODEL) as b,
        httpx.Client(timeout=120) as client,
    ):

        def ask(server, messages):
            body = {"model": MODEL, "messages": messages, "max_tokens": 6, "temperature": 0}
            r = client.post(f"{server.url}/v1/chat/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        yield a, b, ask, disk
    torch.set_num_threads(n)


def test_conversation_evicted_to_disk_resumes_with_cached_tokens(servers):
    tiered, plain, ask, disk = servers
    messages = [{"role": "system", "content": text(300, 1)}, {"role": "user", "content": "go"}]
    turn1 = ask(tiered, messages)
    assert turn1["choices"] == ask(plain, messages)["choices"]
    for i in range(4):  # other conversations push it off the 768-token GPU pools
        for server in (tiered, plain):
            ask(server, [{"role": "user", "content": text(500, 10 + i)}])
    tiered.engine.engine.runner.tier_store.flush()
    assert any(disk.iterdir())
    messages += [turn1["choices"][0]["message"], {"role": "user", "content": "and then?"}]
    turn2 = ask(tiered, messages)
    cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= turn1["usage"]["prompt_tokens"]  # the transcript came back from disk
    stats = tiered.engine.engine.stats()
    assert stats["promoted_blocks_disk"] > 0 and stats["promoted_ckpts_disk"] > 0
    back = ask(plain, messages)
    assert back["usage"]["prompt_tokens_details"]["cached_tokens"] < cached  # plain one recomputed
    assert turn2["choices"] == back["choices"]

"""Grammar-constrained requests inside the engine: constrained and free requests in one batch (the
free ones exactly as alone), with chunked prefill and the prefix cache, on the CPU and (gpu) with
CUDA graphs replaying the decode steps; the mask reference against a plain loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams
from inference.engine.sampler import apply_token_masks
from inference.structured.grammar import with_options

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "n": {"type": "integer"},
        "tags": {"type": "array", "items": {"enum": ["a", "b"]}},
    },
    "required": ["name", "n", "tags"],
    "additionalProperties": False,
}
GRAMMAR = "start: %json " + json.dumps(with_options(SCHEMA))


def test_masks_match_a_plain_loop():
    rng = np.random.default_rng(0)
    logits = torch.randn(3, 70)
    words = rng.integers(-(2**31), 2**31 - 1, size=(3, 3), dtype=np.int64).astype(np.int32)
    got = apply_token_masks(logits, ["a", "b", "c"], {"a": words[0], "c": words[2]})
    want = logits.clone()
    for row, w in ((0, words[0]), (2, words[2])):
        for t in range(70):
            if not (int(w[t // 32]) >> (t % 32)) & 1:
                want[row, t] = float("-inf")
    assert torch.equal(got, want)  # row 1 untouched, ids past the mask's words never allowed


@pytest.mark.parametrize("device", DEVICES)
def test_constrained_and_free_requests_share_a_batch(device):
    cfg = dict(
        num_blocks=256,
        max_model_len=2048,
        max_num_batched_tokens=64,
        enable_chunked_prefill=True,
        enable_prefix_caching=True,
    )
    from inference.engine.engine import EngineConfig

    eng = build_engine(engine_config=EngineConfig.of(**cfg), device=device)
    alone = build_engine(engine_config=EngineConfig.of(**cfg), device=device)
    prompt = list(range(40, 140))  # longer than one step's tokens: chunked
    free = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    constrained = SamplingParams(temperature=0, max_tokens=200, grammar=GRAMMAR)
    ref = alone.generate([prompt], free)[0].output_token_ids
    reqs = eng.generate([prompt, prompt, prompt[:60]], [free, constrained, constrained])
    assert reqs[0].output_token_ids == ref  # a free row is not touched by its neighbours' masks
    for r in reqs[1:]:
        text = eng.tokenizer.decode(r.output_token_ids, skip_special_tokens=True)
        value = json.loads(text)
        assert set(value) == {"name", "n", "tags"} and len(value["name"]) <= 12, text
    # again, now from the prefix cache: the same answers
    again = eng.generate([prompt], constrained)[0]
    assert again.num_cached_tokens > 0 and again.output_token_ids == reqs[1].output_token_ids


def test_constrained_requests_under_tensor_parallelism_match_one_process():
    """The masks travel with the step to every rank, each of which samples the gathered logits:
    TP 2 answers exactly as one process does."""
    from inference.engine.engine import EngineConfig

    cfg = EngineConfig.of(
        num_blocks=96, max_model_len=512, max_num_batched_tokens=32, enable_chunked_prefill=True
    )
    prompts = [list(range(30, 90)), list(range(50, 75))]
    params = [
        SamplingParams(temperature=0, max_tokens=120, grammar=GRAMMAR),
        SamplingParams(temperature=0, max_tokens=8),
    ]
    want = [r.output_token_ids for r in build_engine(engine_config=cfg).generate(prompts, params)]
    engine = build_engine(engine_config=cfg, tensor_parallel_size=2)
    try:
        got = [r.output_token_ids for r in engine.generate(prompts, params)]
    finally:
        engine.runner.close()
    assert got == want
    json.loads(engine.tokenizer.decode(got[0], skip_special_tokens=True))

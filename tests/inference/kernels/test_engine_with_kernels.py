"""The engine with our kernels on vs the same engine on the PyTorch references: greedy tokens and
their logprobs, fp32, for requests run alone, batched with chunked prefill, and resumed from the
prefix cache. On CUDA the kernels run as they serve; without CUDA they run in Triton's
interpreter (`DAYZERO_KERNELS=interpret`), which checks their wiring through the model, the
paged cache and the scheduler end to end."""

from __future__ import annotations

import random

import pytest
import torch

from inference.config import parse_config
from inference.engine.engine import Engine, EngineConfig
from inference.engine.factory import small_model_config
from inference.engine.request import SamplingParams
from inference.model.cache_tensors import HybridCacheSpec
from inference.model.factory import build_model
from inference.tokenizer import ByteTokenizer

STEPS = 4


@pytest.fixture(scope="module")
def model_and_spec():
    spec = parse_config(small_model_config())
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return build_model(spec, load_format="dummy", dtype=torch.float32, device=device, seed=0), spec


def _engine(model, spec, **kw) -> Engine:
    cfg = EngineConfig.of(
        **{**dict(block_size=16, num_blocks=256, num_state_slots=16, checkpoint_interval=32), **kw}
    )
    device = next(model.parameters()).device
    return Engine(model, ByteTokenizer(), cfg, cache_spec=HybridCacheSpec.from_model_spec(spec, torch.float32),
                  device=device, dtype=torch.float32)  # fmt: skip


def _run(model, spec, prompts, **kw):
    sp = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=0)
    return [
        (r.output_token_ids, [lp.logprob for lp in r.logprobs])
        for r in _engine(model, spec, **kw).generate(prompts, sp)
    ]


def _same(got, want, what):
    for n, ((gt, glp), (wt, wlp)) in enumerate(zip(got, want, strict=True)):
        assert gt == wt, f"{what}: request {n} tokens {gt} != {wt}"
        assert max(abs(a - b) for a, b in zip(glp, wlp, strict=True)) <= 1e-4, f"{what}: request {n} logprobs"


@torch.no_grad()
def test_greedy_outputs_with_kernels_equal_references(model_and_spec, monkeypatch):
    model, spec = model_and_spec
    rng = random.Random(3)
    shared = [rng.randrange(256) for _ in range(40)]
    prompts = [shared + [rng.randrange(256) for _ in range(n)] for n in (5, 37, 70)]
    monkeypatch.setenv("DAYZERO_KERNELS", "reference")
    alone_ref = [
        _run(model, spec, [p], enable_prefix_caching=False, enable_chunked_prefill=False)[0] for p in prompts
    ]
    monkeypatch.setenv("DAYZERO_KERNELS", "fast" if torch.cuda.is_available() else "interpret")
    alone = [
        _run(model, spec, [p], enable_prefix_caching=False, enable_chunked_prefill=False)[0] for p in prompts
    ]
    _same(alone, alone_ref, "alone, kernels vs references")
    batched = _run(model, spec, prompts, enable_prefix_caching=False, max_num_batched_tokens=32)
    _same(batched, alone_ref, "batched + chunked prefill, kernels vs references alone")
    cached = _engine(model, spec, enable_prefix_caching=True)
    sp = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, logprobs=0)
    cached.generate(prompts[:1], sp)  # the shared start is now in the prefix cache
    again = cached.generate(prompts[1:], sp)
    assert all(r.num_cached_tokens > 0 for r in again), "the second turn did not hit the prefix cache"
    _same([(r.output_token_ids, [lp.logprob for lp in r.logprobs]) for r in again], alone_ref[1:],
          "from the prefix cache, kernels vs references alone")  # fmt: skip

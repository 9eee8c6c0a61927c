"""The decode fast paths on the GPU, end to end on the bundled small model: the fused Triton
decode ops give the PyTorch references' tokens (fp32, kernels on vs `DAYZERO_KERNELS=reference`),
and the greedy tokens read from a decode graph's own argmax equal the sampler's choice on the
same logits (bf16, CUDA graphs)."""

from __future__ import annotations

import random

import pytest

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams

CFG = EngineConfig.of(
    block_size=16, num_blocks=256, num_state_slots=40, max_num_seqs=16, max_num_batched_tokens=2048,
    max_model_len=1024, enable_prefix_caching=False,
)  # fmt: skip


def _prompts(n: int = 6) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(256) for _ in range(rng.randrange(5, 60))] for _ in range(n)]


def _run(dtype: str, sp: SamplingParams, **cfg) -> tuple[list, object]:
    eng = build_engine(engine_config=CFG.evolve(**cfg), device="cuda", dtype=dtype, fixed_blocks=True)
    return eng.generate(_prompts(), sp), eng


@pytest.mark.gpu
def test_gpu_fused_decode_ops_give_the_references_tokens(monkeypatch):
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    fast, _ = _run("float32", sp)
    monkeypatch.setenv("DAYZERO_KERNELS", "reference")
    ref, _ = _run("float32", sp)
    for a, b in zip(fast, ref, strict=True):
        assert a.output_token_ids == b.output_token_ids
        diff = max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs, strict=True))
        assert diff < 1e-3, f"chosen-token logprob differs by {diff}"


@pytest.mark.gpu
def test_gpu_graph_greedy_tokens_equal_the_samplers():
    graph_argmax, eng = _run("bfloat16", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert eng.runner.graphs is not None and eng.runner.graphs.num_replays > 0
    # logprobs asked: the same graph replays, but the sampler picks from the logits
    sampled, _ = _run("bfloat16", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0))
    assert [r.output_token_ids for r in graph_argmax] == [r.output_token_ids for r in sampled]

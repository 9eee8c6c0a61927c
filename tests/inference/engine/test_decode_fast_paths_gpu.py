"""The decode fast paths on the GPU, end to end on the bundled small model: the fused Triton
decode ops give the PyTorch references' tokens (fp32, kernels on vs `DAYZERO_KERNELS=reference`),
and the greedy tokens read from a decode graph's own argmax equal the sampler's choice on the
same logits (bf16, CUDA graphs); short-step graphs (chunked prefills, decodes beside them)
replay what their padded inputs compute eagerly, and agree with the dense eager prefill path."""

from __future__ import annotations

import random

import pytest

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams
from tests.inference.engine.graph_fakes import EagerGraphs

CFG = EngineConfig.of(
    block_size=16, num_blocks=256, num_state_slots=40, max_num_seqs=16, max_num_batched_tokens=2048,
    max_model_len=1024, enable_prefix_caching=False,
)  # fmt: skip


def _prompts(n: int = 6) -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(256) for _ in range(rng.randrange(5, 60))] for _ in range(n)]


def _run(dtype: str, sp: SamplingParams, config: str | None = None, **cfg) -> tuple[list, object]:
    eng = build_engine(
        config=config, engine_config=CFG.evolve(**cfg), device="cuda", dtype=dtype, fixed_blocks=True
    )
    return eng.generate(_prompts(), sp), eng


def _same_tokens_close_logprobs(outs, refs, tol: float) -> None:
    for a, b in zip(outs, refs, strict=True):
        assert a.output_token_ids == b.output_token_ids
        diff = max(abs(x.logprob - y.logprob) for x, y in zip(a.logprobs, b.logprobs, strict=True))
        assert diff < tol, f"chosen-token logprob differs by {diff}"


@pytest.mark.gpu
def test_gpu_fused_decode_ops_give_the_references_tokens(monkeypatch):
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    fast, _ = _run("float32", sp)
    monkeypatch.setenv("DAYZERO_KERNELS", "reference")
    ref, _ = _run("float32", sp)
    _same_tokens_close_logprobs(fast, ref, 1e-3)


@pytest.mark.gpu
def test_gpu_graph_greedy_tokens_equal_the_samplers():
    graph_argmax, eng = _run("bfloat16", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert eng.runner.graphs is not None and eng.runner.graphs.num_replays > 0
    # logprobs asked: the same graph replays, but the sampler picks from the logits
    sampled, _ = _run("bfloat16", SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0))
    assert [r.output_token_ids for r in graph_argmax] == [r.output_token_ids for r in sampled]


# every prefill in chunks of <= 64 tokens: each step is a short step, mixed with decodes
SHORT = dict(enable_chunked_prefill=True, max_num_batched_tokens=64, enable_prefix_caching=True)


@pytest.mark.gpu
def test_gpu_short_step_graphs_replay_what_their_inputs_compute_eagerly():
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    replayed, eng = _run("bfloat16", sp, **SHORT)
    g = eng.runner.graphs
    assert g is not None and not g.short_disabled and g.num_short_replays > 0
    eng = build_engine(engine_config=CFG.evolve(**SHORT), device="cuda", dtype="bfloat16", fixed_blocks=True)
    r = eng.runner
    r.graphs = EagerGraphs(
        r.model, r.cache, device=r.device, block_size=g.block_size, scratch_block=g.scratch_block,
        scratch_slot=g.scratch_slot, vocab_size=r.vocab_size, short_tokens=g.max_short_tokens,
        short_row_keys=g.short_row_keys, short_capture_after=g.short_capture_after,
    )  # fmt: skip
    eager = eng.generate(_prompts(), sp)
    assert r.graphs.num_short_replays == g.num_short_replays
    _same_tokens_close_logprobs(replayed, eager, 1e-2)


@pytest.mark.gpu
def test_gpu_short_step_graphs_agree_with_the_dense_eager_prefill():
    """Absorbed rows vs expanded keys in bf16: other roundings, so near-ties may flip a token;
    the first token of every prompt and nearly all of the rest agree."""
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    short, eng = _run("bfloat16", sp, **SHORT)
    assert eng.runner.graphs.num_short_replays > 0
    dense, eng = _run("bfloat16", sp, **SHORT, short_graph_tokens=0)
    assert eng.runner.graphs.num_short_replays == 0
    pairs = [
        (a, b)
        for x, y in zip(short, dense, strict=True)
        for a, b in zip(x.output_token_ids, y.output_token_ids, strict=True)
    ]
    assert all(x.output_token_ids[0] == y.output_token_ids[0] for x, y in zip(short, dense, strict=True))
    assert sum(a == b for a, b in pairs) >= 0.9 * len(pairs), pairs


@pytest.mark.gpu
def test_gpu_dsa_decode_and_short_step_graphs_replay_what_eager_steps_compute():
    """DSA (the tiny DeepSeek-V3.2, top-16 of 5-60-token prompts: the indexer really selects): the
    indexer scoring and top-k inside decode and short-step graphs give the eager steps' tokens."""
    sp = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=0)
    dsa = "inference/configs/tiny_deepseek_v32.json"
    replayed, eng = _run("bfloat16", sp, dsa, **SHORT)
    g = eng.runner.graphs
    assert g is not None and g.num_replays > 0 and g.num_short_replays > 0
    eager, eng = _run("bfloat16", sp, dsa, **SHORT, enable_cuda_graphs=False)
    assert eng.runner.graphs is None
    _same_tokens_close_logprobs(replayed, eager, 1e-2)

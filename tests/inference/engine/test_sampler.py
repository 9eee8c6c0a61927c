"""Sampler (greedy, temperature, top-k, top-p, seeds, logprobs) and the engine's stop handling."""

import pytest
import torch

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams
from inference.engine.sampler import Sampler


def logits(rows=4, vocab=50, seed=0):
    return torch.randn(rows, vocab, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_and_degenerate_filters_equal_argmax():
    x = logits()
    s = Sampler()
    argmax = x.argmax(-1).tolist()
    for sp in (
        SamplingParams(temperature=0),
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=0.7, top_p=1e-6),
    ):
        toks, _ = s(x, [sp] * 4, [f"r{i}" for i in range(4)])
        assert toks == argmax


def test_seeded_rows_reproduce_alone_and_batched():
    x = logits(rows=3)
    sp = SamplingParams(temperature=1.0, seed=1234)
    alone = [Sampler()(x[1:2], [sp], ["a"])[0][0] for _ in range(2)]
    batched = Sampler()(
        x, [SamplingParams(temperature=1.0), sp, SamplingParams(temperature=0)], ["x", "a", "y"]
    )[0]
    assert alone[0] == alone[1] == batched[1]


def test_top_k_and_top_p_restrict_support():
    x = torch.tensor([[5.0, 4.0, 3.0, -10.0, -10.0]]).repeat(200, 1)
    toks, _ = Sampler()(x, [SamplingParams(temperature=1.0, top_k=2)] * 200, [str(i) for i in range(200)])
    assert set(toks) <= {0, 1} and len(set(toks)) == 2
    p = torch.softmax(x[0], -1)
    toks, _ = Sampler()(
        x, [SamplingParams(temperature=1.0, top_p=float(p[0]) + 1e-3)] * 200, [str(i) for i in range(200)]
    )
    assert set(toks) == {0, 1}


def test_logprobs():
    x = logits(rows=2)
    toks, lps = Sampler()(
        x, [SamplingParams(temperature=0, logprobs=3), SamplingParams(temperature=0)], ["a", "b"]
    )
    ref = torch.log_softmax(x[0], -1)
    assert lps[1] is None
    assert lps[0].token_id == toks[0] and lps[0].logprob == pytest.approx(float(ref.max()), abs=1e-5)
    assert [t for t, _ in lps[0].top] == ref.topk(3).indices.tolist()


@pytest.mark.parametrize(
    "bad",
    [
        dict(temperature=-0.1),
        dict(top_p=0.0),
        dict(top_p=1.5),
        dict(top_k=-1),
        dict(max_tokens=0),
        dict(logprobs=21),
        dict(stop=("",)),
        dict(min_tokens=5, max_tokens=2),
        dict(temperature=float("nan")),
    ],
)
def test_invalid_sampling_values(bad):
    with pytest.raises(ValueError):
        SamplingParams(**bad)


def test_engine_stops_on_string_token_and_length():
    eng = build_engine(
        engine_config=EngineConfig.of(
            num_blocks=64, num_state_slots=16, max_model_len=256, checkpoint_interval=64
        )
    )
    prompt = list(b"The quick brown fox")
    ref = eng.generate([prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True))[0]
    text = eng.tokenizer.decode(ref.output_token_ids, skip_special_tokens=True)
    # a stop string taken from the middle of the greedy text cuts there
    stop = text[10:13] if len(text) > 13 else text[-2:]
    rid = eng.add_request(prompt, SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop=(stop,)))
    outs = []
    while eng.has_unfinished:
        outs += [o for o in eng.step() if o.request_id == rid]
    got = "".join(o.new_text for o in outs)
    assert outs[-1].finish_reason == "stop" and outs[-1].stop_reason == stop
    assert got == text[: text.find(stop)] and stop not in got
    # a stop token ends the request and is reported as the stop reason
    tok = ref.output_token_ids[5]
    r = eng.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=30, ignore_eos=True, stop_token_ids=(tok,))
    )[0]
    assert r.output_token_ids == ref.output_token_ids[: ref.output_token_ids.index(tok) + 1]
    assert r.stop_reason == tok and r.finish_reason == "stop"
    assert eng.scheduler.cache.num_request_blocks == 0

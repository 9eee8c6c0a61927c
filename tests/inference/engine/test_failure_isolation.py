"""A failed batched step isolates the request that broke it, also when the breaking work is not
the request's first step (a later prompt chunk, or its first sampling after several chunks):
the suspects run alone until they have redone the failed step's work, so the loop "solo step
passes, batch fails again" cannot happen (CPU, fp32, the bundled small random model)."""

import random

import pytest

from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams

CFG = EngineConfig.of(
    block_size=8,
    num_blocks=256,
    num_state_slots=32,
    max_num_seqs=8,
    max_num_batched_tokens=24,  # a 50-token prompt takes three chunks
    max_model_len=512,
    enable_chunked_prefill=True,
    enable_prefix_caching=False,
)
GREEDY = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)


def _prompts() -> list[list[int]]:
    rng = random.Random(3)
    return [[rng.randrange(256) for _ in range(n)] for n in (50, 12, 20)]


@pytest.fixture(scope="module")
def alone() -> list[list[int]]:
    eng = build_engine(engine_config=CFG)
    return [eng.generate([p], GREEDY)[0].output_token_ids for p in _prompts()[1:]]


def test_request_failing_after_its_first_chunk_fails_alone(alone) -> None:
    eng = build_engine(engine_config=CFG)
    bad = SamplingParams(temperature=1.0, max_tokens=6)
    object.__setattr__(bad, "seed", 2**70)  # past validation: its seeded generator raises when it samples
    ps = _prompts()
    rids = [eng.add_request(ps[0], bad)] + [eng.add_request(p, GREEDY) for p in ps[1:]]
    done: dict[str, list[int]] = {}
    failed: list[str] = []
    for _ in range(200):
        if not eng.has_unfinished:
            break
        try:
            outs = eng.step()
        except Exception:  # the poisoned request's sampler raised
            failed += eng.recover_after_failed_step()
            continue
        for o in outs:
            done.setdefault(o.request_id, []).extend(o.new_token_ids)
    assert not eng.has_unfinished, "isolation looped: the poisoned request was never run alone"
    assert failed == [rids[0]]
    assert [done[r] for r in rids[1:]] == alone
    assert not done.get(rids[0])  # the poisoned request never produced a token

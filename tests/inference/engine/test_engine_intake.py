"""The engine's way in: who owns a prompt's list, what a `PrefixLink` saves and what it never skips
(CPU, fp32, the bundled small random model)."""

import pytest

from inference.cache.records import PrefixLink
from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams

CFG = EngineConfig.of(block_size=8, num_blocks=256, num_state_slots=32, max_num_seqs=4, max_model_len=512)
GREEDY = SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)


@pytest.fixture(scope="module")
def engine():
    return build_engine(engine_config=CFG)


def run(eng, rid):
    while eng.has_unfinished:
        eng.step()
    return rid


def test_a_handed_over_list_is_kept_and_others_are_copied(engine):
    ids = list(range(1, 30))
    rid = engine.add_request(ids, GREEDY, handover=True)
    assert engine.get_request(rid).token_ids is ids  # no copy of the prompt on the way in
    run(engine, rid)
    assert len(ids) == 29 + 4  # the request appended its output to the list it owns
    mine = list(range(1, 30))
    rid = engine.add_request(mine, GREEDY)
    assert engine.get_request(rid).token_ids is not mine
    assert engine.get_request(rid).prompt_token_ids == mine
    run(engine, rid)
    assert mine == list(range(1, 30))


def test_a_linked_prompt_checks_only_what_is_new(engine):
    vocab = engine.tokenizer.vocab_size
    first = [5] * 40
    run(engine, engine.add_request(first, GREEDY, prefix_link=PrefixLink("t1")))
    assert "t1" in engine.scheduler.cache.kept
    with pytest.raises(ValueError, match="prompt token ids"):  # new tokens are always checked
        engine.add_request([5] * 40 + [vocab], GREEDY, prefix_link=PrefixLink("t2", "t1", 40))
    with pytest.raises(ValueError, match="prefix_link shares"):
        engine.add_request([5] * 10, GREEDY, prefix_link=PrefixLink("t2", "t1", 40))
    # a link to a request the engine does not keep vouches for nothing: every token is checked
    with pytest.raises(ValueError, match="prompt token ids"):
        engine.add_request([vocab] + [5] * 40, GREEDY, prefix_link=PrefixLink("t2", "gone", 40))
    rid = engine.add_request([5] * 40 + [6, 7], GREEDY, prefix_link=PrefixLink("t2", "t1", 40))
    reused = engine.scheduler.cache.kept.reused
    run(engine, rid)
    assert engine.scheduler.cache.kept.reused == reused + 40 // 8

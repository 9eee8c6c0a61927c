"""The engine on the bundled small random-weight model (CPU, fp32): greedy outputs are identical
with and without the prefix cache, with chunked prefill on and off, alone and batched, and under
preemption; the multi-turn replay's cached-token counts follow the checkpoint rule exactly."""

import random

import pytest

from inference.chat import engine_frontend
from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams
from tests.inference.engine.engine_fakes import checkpoint_positions, expected_hit
from tests.inference.engine.graph_fakes import EagerGraphs

BASE = EngineConfig.of(
    block_size=8,
    num_blocks=512,
    num_state_slots=96,
    max_num_seqs=16,
    max_num_batched_tokens=4096,
    max_model_len=2048,
    enable_chunked_prefill=False,
    enable_prefix_caching=False,
    checkpoint_interval=32,
)
GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


def prompts(n=8, seed=0):
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(70)]
    return [
        system[: rng.randrange(20, 70)] + [rng.randrange(256) for _ in range(rng.randrange(1, 40))]
        for _ in range(n)
    ]


@pytest.fixture(scope="module")
def reference():
    """Each prompt alone, no prefix cache, no chunking."""
    eng = build_engine(engine_config=BASE)
    return [eng.generate([p], GREEDY)[0].output_token_ids for p in prompts()]


@pytest.mark.parametrize(
    "cfg",
    [
        dict(),
        dict(enable_chunked_prefill=True, max_num_batched_tokens=24),
        dict(enable_prefix_caching=True),
        dict(enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=40),
    ],
    ids=["batched", "batched-chunked", "batched-prefix-cache", "batched-prefix-cache-chunked"],
)
def test_greedy_outputs_identical(reference, cfg):
    eng = build_engine(engine_config=BASE.evolve(**cfg))
    ps = prompts()
    for _wave in range(2):  # with the prefix cache, the second wave starts from checkpoints
        outs = [r.output_token_ids for r in eng.generate(ps, GREEDY)]
        assert outs == reference
    if cfg.get("enable_prefix_caching"):
        assert eng.scheduler.cached_tokens_admitted > 0
    pool = eng.scheduler.cache
    pool.check_invariants()
    assert pool.num_request_blocks == 0 and pool.states.num_live == 0


def test_memory_pressure_preemption(reference):
    cfg = BASE.evolve(
        num_blocks=40,
        max_model_len=40 * 8,  # the pool holds one sequence of max_model_len (the start-up plan's rule)
        enable_chunked_prefill=True,
        max_num_batched_tokens=64,
        enable_prefix_caching=True,
    )
    eng = build_engine(engine_config=cfg)
    outs = [r.output_token_ids for r in eng.generate(prompts(), GREEDY)]
    assert eng.scheduler.num_preemptions > 0
    assert outs == reference
    assert eng.scheduler.cache.num_request_blocks == 0


def test_multi_turn_replay_8x10():
    """8 conversations x 10 turns sharing a system prompt, replayed with and without the cache."""
    rng = random.Random(3)
    system = [rng.randrange(256) for _ in range(50)]
    users = [[[rng.randrange(256) for _ in range(rng.randrange(4, 14))] for _ in range(10)] for _ in range(8)]
    im_end = 259  # <|im_end|> of the byte tokenizer closes every reply in the transcript
    cfg = BASE.evolve(
        enable_chunked_prefill=True, max_num_batched_tokens=4096, num_blocks=1024, num_state_slots=512
    )
    results = {}
    for cached in (True, False):
        eng = build_engine(engine_config=cfg.evolve(enable_prefix_caching=cached))
        convs = [list(system) for _ in range(8)]
        history = []
        warm = eng.generate([list(system)], GREEDY)[0]  # the shared system prompt alone
        history.append((warm.token_ids, checkpoint_positions(50, 0, len(warm.token_ids), 8, 32, budget=4096)))
        outs, hits, plens = [], [], []
        for turn in range(10):
            batch = [convs[c] + users[c][turn] for c in range(8)]
            expect = [expected_hit(p, history) if cached else 0 for p in batch]
            sp = SamplingParams(temperature=0, max_tokens=4 + turn % 5)
            done = eng.generate(batch, sp)
            for c, r in enumerate(done):
                assert r.num_cached_tokens == expect[c], (turn, c, r.num_cached_tokens, expect[c])
                history.append(
                    (
                        r.token_ids,
                        checkpoint_positions(len(batch[c]), expect[c], len(r.token_ids), 8, 32, budget=4096),
                    )
                )
                convs[c] = [*r.token_ids, im_end]
                outs.append(r.output_token_ids)
                hits.append(r.num_cached_tokens)
                plens.append(len(batch[c]))
        results[cached] = (outs, hits, plens)
        eng.scheduler.cache.check_invariants()
    assert results[True][0] == results[False][0]
    _, hits, plens = results[True]
    assert hits[:8] == [50] * 8  # turn 1: the whole shared system prompt (the warm-up's prompt end)
    # later turns resume at the end of their previous generation: only the new message is computed
    assert all(plen - hit <= 16 for hit, plen in zip(hits[8:], plens[8:], strict=True))


def steps_to_first_token(eng, prompt, sp, message_ends=()):
    """Engine steps from admission to the request's first token; runs it to the end."""
    rid = eng.add_request(prompt, sp, message_ends=message_ends)
    steps, first, out, cached = 0, None, [], -1
    while eng.has_unfinished:
        steps += 1
        for o in eng.step():
            if o.request_id == rid:
                if first is None and o.new_token_ids:
                    first, cached = steps, o.num_cached_tokens
                out += o.new_token_ids
    return first, out, cached


def test_a_cached_turn_is_prefilled_in_one_step():
    """benchmarks/engine.py's turn-10 scenario in small: each returning turn's new tokens (the
    reply's last token, a user message crossing block boundaries and interval multiples) are
    prefilled in one step, and the replies equal a cache-less engine's."""
    rng = random.Random(11)
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    cfg = BASE.evolve(enable_chunked_prefill=True, max_num_batched_tokens=256, enable_cuda_graphs=False)
    eng = build_engine(engine_config=cfg.evolve(enable_prefix_caching=True))
    plain = build_engine(engine_config=cfg)
    transcript = [rng.randrange(256) for _ in range(100)]
    for turn in range(10):
        prompt = transcript + [rng.randrange(256) for _ in range(20)]
        steps, reply, cached = steps_to_first_token(eng, prompt, sp)
        assert reply == plain.generate([prompt], sp)[0].output_token_ids
        if turn == 0:
            assert (cached, steps) == (0, 5)  # cut at 32, 64, 96 (interval) and 112 (last block)
        else:  # resumed at the previous generation's end; before: two or three steps
            assert cached == len(transcript) - 1 and steps == 1, (turn, cached, steps)
        transcript = prompt + reply
    eng.scheduler.cache.check_invariants()


def test_a_cached_chat_turn_is_prefilled_in_one_step_despite_its_message_ends():
    """Turns rendered by the chat template, as the server sends them: the message ends of the
    reply and the user message a turn adds are checkpoint positions among its new tokens, yet the
    turn is one step (it was five or six here); replies equal a cache-less engine's."""
    cfg = BASE.evolve(enable_chunked_prefill=True, max_num_batched_tokens=256, enable_cuda_graphs=False)
    eng = build_engine(engine_config=cfg.evolve(enable_prefix_caching=True))
    plain = build_engine(engine_config=cfg)
    template = engine_frontend(eng).renderer
    sp = SamplingParams(temperature=0, max_tokens=6, ignore_eos=True)
    messages = [{"role": "system", "content": "You are terse. " * 10}, {"role": "user", "content": "first"}]
    previous = 0  # the previous turn's prompt length
    for turn in range(4):
        r = template.render(messages, add_generation_prompt=True)
        steps, reply, cached = steps_to_first_token(eng, r.token_ids, sp, r.message_ends)
        assert reply == plain.generate([r.token_ids], sp)[0].output_token_ids
        if turn:
            assert sum(cached < p < len(r.token_ids) for p in r.message_ends) == 2
            assert cached >= previous and steps == 1, (turn, cached, steps)
        previous = len(r.token_ids)
        messages += [
            {"role": "assistant", "content": eng.tokenizer.decode(reply)},
            {"role": "user", "content": f"question {turn}"},
        ]


def test_abort_frees_blocks_and_slot():
    eng = build_engine(engine_config=BASE.evolve(enable_prefix_caching=True))
    rid = eng.add_request(prompts()[0], SamplingParams(temperature=0, max_tokens=100))
    other = eng.add_request(prompts()[1], SamplingParams(temperature=0, max_tokens=3))
    while eng.get_request(other) is not None:
        eng.step()
    assert eng.scheduler.cache.states.num_live == 1  # `other` is done, `rid` runs
    out = eng.abort([rid])
    assert out[0].finished and out[0].finish_reason == "abort"
    c = eng.scheduler.cache
    assert c.num_request_blocks == 0 and c.states.num_live == 0 and not eng.has_unfinished
    assert rid not in eng.runner.tables and other not in eng.runner.tables


@pytest.mark.parametrize(
    "cfg",
    [dict(), dict(enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=40)],
    ids=["batched", "prefix-cache-chunked"],
)
def test_padded_decode_graph_inputs_give_identical_outputs(reference, cfg):
    eng = build_engine(engine_config=BASE.evolve(**cfg))
    runner = eng.runner
    kv = next(iter(runner.cache.kv.values()))
    scratch_block, scratch_slot = kv.shape[0] - 1, runner.cache.num_slots - 1
    assert (
        scratch_block == BASE.cache.num_blocks and scratch_slot == BASE.cache.num_state_slots
    )  # one spare each
    runner.graphs = EagerGraphs(
        runner.model, runner.cache, device=runner.device, block_size=BASE.cache.block_size,
        scratch_block=scratch_block, scratch_slot=scratch_slot, batch_buckets=(1, 2, 4, 8, 16),
        vocab_size=runner.vocab_size,
    )  # fmt: skip
    ps = prompts()[:6]  # 6 sequences decode in the 8-row bucket: two padding rows per step
    for _wave in range(2):
        outs = [r.output_token_ids for r in eng.generate(ps, GREEDY)]
        assert outs == reference[:6]
    assert runner.graphs.num_replays > 0
    layer = next(iter(runner.cache.state))
    assert runner.cache.state[layer][scratch_slot].abs().sum() > 0  # padding rows ran, in the spare slot
    pool = eng.scheduler.cache
    pool.check_invariants()
    assert pool.num_request_blocks == 0 and pool.states.num_live == 0


@pytest.mark.parametrize("row_keys", [1 << 30, 600], ids=["all-short", "budget-splits"])
def test_padded_short_step_graph_inputs_give_identical_outputs(reference, row_keys):
    """Every step of <= 48 new tokens (chunked prefills of 40, decodes, both mixed) through the
    short-step graph bookkeeping: padded to token and sequence buckets, the padding tokens one
    extra sequence in the scratch slot, every attention row absorbed over its own keys and the
    KDA lengths read from `cu_seqlens` only; the tokens stay those of the plain engine. With a
    small row-key budget the long-context steps fall back to the eager path in between."""
    eng = build_engine(
        engine_config=BASE.evolve(
            enable_prefix_caching=True, enable_chunked_prefill=True, max_num_batched_tokens=40
        )
    )
    runner = eng.runner
    scratch_block, scratch_slot = BASE.cache.num_blocks, BASE.cache.num_state_slots
    runner.graphs = EagerGraphs(
        runner.model, runner.cache, device=runner.device, block_size=BASE.cache.block_size,
        scratch_block=scratch_block, scratch_slot=scratch_slot, batch_buckets=(1, 2, 4, 8, 16),
        vocab_size=runner.vocab_size, short_tokens=48, short_row_keys=row_keys, short_capture_after=1,
    )  # fmt: skip
    eager = []
    model_forward = runner.model.forward
    runner.model.forward = lambda ids, meta, *a, **k: (
        eager.append(meta.row_seq is None and not meta.is_pure_decode) or model_forward(ids, meta, *a, **k)
    )
    ps = prompts()[:6]
    for _wave in range(2):
        outs = [r.output_token_ids for r in eng.generate(ps, GREEDY)]
        assert outs == reference[:6]
    assert runner.graphs.num_short_replays > 0
    assert any(eager) == (row_keys == 600)  # the budget sends some prefill steps to the eager path
    pool = eng.scheduler.cache
    pool.check_invariants()
    assert pool.num_request_blocks == 0 and pool.states.num_live == 0


def test_prompt_ids_outside_the_vocabulary_are_refused_before_anything_is_queued():
    eng = build_engine()
    vocab = eng.tokenizer.vocab_size
    for bad in ([1, -1, 2], [vocab], [0, vocab + 5]):
        with pytest.raises(ValueError, match=r"prompt token ids must be in \[0, "):
            eng.add_request(bad)
    assert not eng.has_unfinished
    eng.add_request([0, vocab - 1])
    assert eng.has_unfinished

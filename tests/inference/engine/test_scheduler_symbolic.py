"""Scheduler + cache coordinator against a symbolic executor that checks every KV and state read."""

import random

import pytest

from inference.cache.coordinator import CacheConfig
from inference.engine.request import RequestStatus, SamplingParams, make_request
from inference.engine.scheduler import Scheduler, SchedulerConfig
from tests.inference.engine.engine_fakes import SymbolicExecutor, expected_hit, reference_output
from tests.inference.engine.engine_fakes import checkpoint_positions as _positions

B, INTERVAL = 4, 16


def make(num_blocks=256, slots=64, prefix=True, chunked=True, budget=64, max_seqs=16):
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget, enable_chunked_prefill=chunked),
        CacheConfig(
            block_size=B,
            num_blocks=num_blocks,
            num_state_slots=slots,
            enable_prefix_caching=prefix,
            checkpoint_interval=INTERVAL,
        ),
    )


def prompts(n, seed=0):
    rng = random.Random(seed)
    shared = [rng.randrange(97) for _ in range(37)]
    return [
        shared[: rng.randrange(10, 37)] + [rng.randrange(97) for _ in range(rng.randrange(1, 30))]
        for _ in range(n)
    ]


def assert_pools_empty(sched):
    c = sched.cache
    c.check_invariants()
    assert c.num_request_blocks == 0
    assert c.states.num_live == 0


@pytest.mark.parametrize(
    "kw",
    [
        dict(),
        dict(prefix=False),
        dict(chunked=False),
        dict(budget=7),
        dict(num_blocks=24, budget=32),  # memory pressure: preemption by recompute
        dict(slots=5, max_seqs=4),
    ],
    ids=["default", "no-prefix-cache", "no-chunking", "tiny-budget", "preemption", "few-slots"],
)
def test_outputs_equal_reference(kw):
    sched = make(**kw)
    ex = SymbolicExecutor(sched)
    ps = prompts(12)
    for wave in range(2):  # the second wave hits the first one's prefixes
        for i, p in enumerate(ps):
            sched.add(make_request(f"w{wave}-{i}", p, SamplingParams(temperature=0, max_tokens=9)))
        done = {r.request_id: r for r in ex.run()}
        for i, p in enumerate(ps):
            r = done[f"w{wave}-{i}"]
            assert r.output_token_ids == reference_output(p, 9)
            assert r.status == RequestStatus.FINISHED_LENGTH
    if kw.get("num_blocks") == 24:
        assert sched.num_preemptions > 0
    if kw.get("prefix", True) and "slots" not in kw:  # with 5 slots, checkpoints rarely survive
        assert sched.cached_tokens_admitted > 0
    elif not kw.get("prefix", True):
        assert sched.cached_tokens_admitted == 0
    assert_pools_empty(sched)


def test_chunks_obey_budget_and_cut_at_checkpoints():
    sched = make(budget=10)
    ex = SymbolicExecutor(sched)
    p = list(range(1, 43))  # 42 tokens: interval cuts at 16 and 32, the last block boundary at 40
    sched.add(make_request("a", p, SamplingParams(temperature=0, max_tokens=3)))
    ends = []
    while sched.has_unfinished:
        out = sched.schedule()
        assert out.num_tokens <= 10
        ends += [s.start + len(s.token_ids) for s in out.scheduled]
        sched.update(out, ex.execute(out))
    assert ends == [10, 16, 26, 32, 40, 42, 43, 44]
    ck = sched.cache.states
    assert (
        ck.num_checkpoints == 5
    )  # 16, 32 (interval), 40 (last block), 42 (end of prompt), 44 (end of generation)
    assert len(sched.cache._ckpt_block) == 1  # 42 lies inside a block: it owns a private KV copy


def checkpoint_positions(prompt_len, hit, final_len, budget):
    return _positions(prompt_len, hit, final_len, B, INTERVAL, budget=budget)


def test_multi_turn_replay_cached_tokens_follow_the_rule():
    sched = make(num_blocks=2048, slots=512, budget=4096, max_seqs=16)
    ex = SymbolicExecutor(sched)
    rng = random.Random(7)
    system = [rng.randrange(97) for _ in range(45)]
    convs = [list(system) for _ in range(8)]
    history = []  # (final tokens, checkpoint positions) of finished requests
    # warm-up: the shared system prompt alone
    sched.add(make_request("warm", [*system, 1, 2], SamplingParams(temperature=0, max_tokens=3)))
    (w,) = ex.run()
    history.append((w.token_ids, checkpoint_positions(47, 0, len(w.token_ids), 4096)))
    for turn in range(10):
        reqs = []
        for c in range(8):
            convs[c] += [rng.randrange(97) for _ in range(rng.randrange(3, 12))]  # the next user message
            r = make_request(
                f"c{c}t{turn}", list(convs[c]), SamplingParams(temperature=0, max_tokens=rng.randrange(2, 9))
            )
            reqs.append((r, expected_hit(r.token_ids, history)))
            sched.add(r)
        ex.run()
        for r, exp in reqs:
            assert r.num_cached_tokens == exp, (r.request_id, r.num_cached_tokens, exp)
            assert r.output_token_ids == reference_output(r.prompt_token_ids, r.sampling.max_tokens)
            c = int(r.request_id[1])
            convs[c] = list(r.token_ids)  # the transcript goes on with the reply
            history.append(
                (r.token_ids, checkpoint_positions(r.num_prompt_tokens, exp, len(r.token_ids), 4096))
            )
        if turn >= 1:
            assert all(exp > len(r.prompt_token_ids) - 2 * B - 12 for r, exp in reqs)
    assert_pools_empty(sched)


def test_abort_frees_blocks_and_slot():
    sched = make()
    ex = SymbolicExecutor(sched)
    sched.add(make_request("a", list(range(30)), SamplingParams(temperature=0, max_tokens=50)))
    sched.add(make_request("b", list(range(5, 40)), SamplingParams(temperature=0, max_tokens=50)))
    for _ in range(4):
        out = sched.schedule()
        sched.update(out, ex.execute(out))
    assert sched.cache.states.num_live == 2
    sched.abort(["a"])
    assert sched.cache.states.num_live == 1
    sched.abort(["b", "unknown"])
    assert_pools_empty(sched)
    assert not sched.has_unfinished


def test_request_too_long_is_rejected():
    sched = make(num_blocks=4)
    with pytest.raises(ValueError, match="KV pool"):
        sched.add(make_request("x", list(range(20))))
    sched2 = make(chunked=False, budget=8)
    with pytest.raises(ValueError, match="chunked prefill"):
        sched2.add(make_request("y", list(range(20))))


def test_resume_inside_a_block_copies_the_partial_block():
    sched = make()
    ex = SymbolicExecutor(sched)
    a = make_request("a", list(range(10)), SamplingParams(temperature=0, max_tokens=4))  # B=4: ends inside
    sched.add(a)
    ex.run()
    assert a.num_cached_tokens == 0
    nxt = [*a.token_ids, 50, 51]  # the next turn: the transcript plus a new message
    b = make_request("b", nxt, SamplingParams(temperature=0, max_tokens=2))
    sched.add(b)
    out = sched.schedule()
    assert b.num_cached_tokens == len(a.token_ids) - 1 == 13  # the end of a's generation
    # first a's deferred end-of-generation snapshot (state + partial block), then b's resume copies
    assert len(out.state_copies) == 2 and len(out.block_copies) == 2
    assert out.state_copies[0][1] == out.state_copies[1][0]
    assert out.block_copies[0][1] == out.block_copies[1][0]
    (s,) = out.scheduled
    assert s.start == 13 and s.token_ids == tuple(nxt[13:])
    sched.update(out, ex.execute(out))
    ex.run()
    assert b.output_token_ids == reference_output(nxt, 2)
    retry = make_request("a-again", list(range(10)), SamplingParams(temperature=0, max_tokens=4))
    sched.add(retry)  # the same prompt again: the end-of-prompt checkpoint (10) is one too deep,
    ex.run()  # the one at its last block boundary (8) serves
    assert retry.num_cached_tokens == 8
    assert retry.output_token_ids == a.output_token_ids
    assert_pools_empty(sched)


def prefill_ends(sched, ex, req_id):
    """Run to the end; the end position of each step that computed prompt tokens of `req_id`."""
    ends = []
    while sched.has_unfinished:
        out = sched.schedule()
        req = sched.requests.get(req_id)
        for s in out.scheduled:
            if s.req_id == req_id and req is not None and s.start < req.num_prompt_tokens:
                ends.append(s.start + len(s.token_ids))
        sched.update(out, ex.execute(out))
        sched.cache.check_invariants()
    return ends


@pytest.mark.parametrize("budget", [64, 16], ids=["fits-one-step", "budget-short"])
def test_a_returning_turn_is_prefilled_in_one_step_when_it_fits(budget):
    sched = make(budget=budget)
    ex = SymbolicExecutor(sched)
    a = make_request("a", list(range(1, 28)), SamplingParams(temperature=0, max_tokens=3))
    sched.add(a)
    ex.run()
    # the next turn resumes at a's generation end (29); its 19 new tokens span the interval
    # multiple 32, block boundaries up to its last one (44) and two message ends (31, 40)
    nxt = [*a.token_ids, *range(60, 78)]
    assert len(nxt) == 48
    b = make_request("b", nxt, SamplingParams(temperature=0, max_tokens=2), message_ends=(31, 40))
    sched.add(b)
    ends = prefill_ends(sched, ex, "b")
    assert b.num_cached_tokens == 29
    if budget == 64:
        assert ends == [48]  # one step (before: 29 -> 31, 32, 40, 44, 48: five)
    else:  # the rest does not fit in one step: chunked and cut at the checkpoint positions as before
        assert ends == [31, 32, 40, 44, 48]
    assert b.output_token_ids == reference_output(nxt, 2)
    # a fresh prompt is still cut at its positions (the shared system prompt, a repeat)
    c = make_request(
        "c", list(range(200, 242)), SamplingParams(temperature=0, max_tokens=1), message_ends=(9,)
    )
    sched.add(c)
    assert prefill_ends(sched, ex, "c") == [9, 16, 32, 40, 42]
    assert_pools_empty(sched)

"""The offload tiers' bookkeeping (tiers.py, promotion.py) alone and under the scheduler, against
the symbolic executor: KV blocks and state checkpoints evicted from tiny GPU pools go to the host
and disk tiers and come back (after a transfer delay) with outputs identical to the reference."""

import random

import pytest

from inference.cache.block_pool import HIGH, LOW, BlockKey
from inference.cache.coordinator import CacheConfig
from inference.cache.tiers import (
    BLOCK,
    DISK,
    HOST,
    STATE,
    Drop,
    Move,
    Store,
    TierCapacity,
    TierConfig,
    TierIndex,
    tier_capacity,
)
from inference.engine.request import SamplingParams, make_request
from inference.engine.scheduler import Scheduler, SchedulerConfig
from tests.inference.engine.engine_fakes import SymbolicExecutor, reference_output

B, INTERVAL = 4, 16


def key(i, parent=None):
    return BlockKey(parent, (i,))


def test_capacity_split():
    cap = tier_capacity(TierConfig(host_bytes=1000), block_bytes=10, state_bytes=50)
    assert cap.host_states == 5 and cap.host_blocks == 75  # states take at most a quarter
    assert tier_capacity(TierConfig(host_bytes=40), 10, 50) == TierCapacity(4, 0, 0)


def test_host_lru_low_before_high_then_demoted_to_disk():
    t = TierIndex(TierCapacity(host_blocks=2, host_states=0, disk_bytes=1), block_bytes=1, state_bytes=1)
    assert t.store_block(7, key(0), HIGH) and t.store_block(8, key(1), LOW)
    assert t.take_ops() == [Store(BLOCK, 7, HOST, 0), Store(BLOCK, 8, HOST, 1)]
    assert t.store_block(9, key(2), HIGH)  # host full: the LOW one goes to disk
    ops = t.take_ops()
    assert isinstance(ops[0], Move) and isinstance(ops[1], Store) and ops[1].loc == ops[0].src
    assert t.block(key(1)).tier == DISK and t.block(key(0)).tier == HOST
    assert t.store_block(10, key(3), HIGH)  # disk full too: its LRU entry is deleted
    ops = t.take_ops()
    assert [type(o) for o in ops] == [Drop, Move, Store] and t.block(key(1)) is None
    assert t.block(key(0)).tier == DISK
    t.check_invariants()


def test_interval_snapshots_leave_the_host_tier_before_resume_points():
    t = TierIndex(TierCapacity(host_blocks=0, host_states=2, disk_bytes=1), block_bytes=1, state_bytes=1)
    resume, interval, newer = key(0), key(1), key(2)
    assert t.store_ckpt(resume.hash, resume, slot=1, block=None, num_tokens=4, priority=HIGH)
    assert t.store_ckpt(interval.hash, interval, slot=2, block=None, num_tokens=4, priority=LOW)
    assert t.store_ckpt(newer.hash, newer, slot=3, block=None, num_tokens=8, priority=HIGH)
    assert t.ckpt(interval.hash, interval).tier == DISK  # the LOW one moved down, though newer
    assert t.ckpt(resume.hash, resume).tier == HOST and t.ckpt(newer.hash, newer).tier == HOST
    t.check_invariants()


def test_pinned_entries_are_never_evicted_and_inclusive_restore():
    t = TierIndex(TierCapacity(1, 0, 0), 1, 1)
    assert t.store_block(1, key(0), LOW)
    e = t.block(key(0))
    t.pin(e)
    assert not t.store_block(2, key(1), LOW)  # nothing evictable: the store is refused
    t.unpin(e)
    assert t.store_block(2, key(0), LOW)  # already there (restored earlier): no copy
    assert t.take_ops() == [Store(BLOCK, 1, HOST, 0)]
    t.check_invariants()


def test_dropping_a_block_drops_the_checkpoints_that_need_it():
    t = TierIndex(TierCapacity(1, 1, 0), 1, 1)
    k = key(0)
    t.store_block(1, k, HIGH)
    t.store_ckpt(k.hash, k, slot=3, block=None, num_tokens=4, priority=HIGH)
    assert t.ckpt(k.hash, k) is not None
    t.store_block(2, key(5), HIGH)  # pushes the block out: its checkpoint is useless now
    assert t.block(k) is None and t.ckpt(k.hash, k) is None
    t.check_invariants()


def make(tiers: TierConfig, num_blocks=24, slots=6, budget=32, max_seqs=4):
    return Scheduler(
        SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=budget),
        CacheConfig(
            block_size=B,
            num_blocks=num_blocks,
            num_state_slots=slots,
            checkpoint_interval=INTERVAL,
            tiers=tiers,
        ),
    )


def conversations(n, seed=0):
    rng = random.Random(seed)
    shared = [rng.randrange(97) for _ in range(23)]
    return [
        shared[: rng.randrange(5, 23)] + [rng.randrange(97) for _ in range(rng.randrange(20, 40))]
        for _ in range(n)
    ]


TIERS = {
    "none": TierConfig(),
    "host": TierConfig(host_bytes=400),
    "disk": TierConfig(disk_bytes=400),
    "host+disk-tiny": TierConfig(host_bytes=24, disk_bytes=60),
}


def replay(tiers: TierConfig, delay: int):
    """Each conversation's first turn, then every one comes back with its transcript + a new turn
    (by then the tiny GPU pools have evicted it)."""
    sched = make(tiers)
    ex = SymbolicExecutor(sched, transfer_delay=delay)
    firsts = conversations(10)
    for i, p in enumerate(firsts):
        sched.add(make_request(f"a{i}", p, SamplingParams(temperature=0, max_tokens=6)))
    done = {r.request_id: r for r in ex.run()}
    cached = 0
    for i, p in enumerate(firsts):
        r = done[f"a{i}"]
        assert r.output_token_ids == reference_output(p, 6)
        turn2 = p + r.output_token_ids + [i, i + 1, i + 2]
        sched.add(make_request(f"b{i}", turn2, SamplingParams(temperature=0, max_tokens=6)))
        (r2,) = ex.run()  # one at a time: it finds its own transcript below the GPU
        assert r2.output_token_ids == reference_output(turn2, 6)
        cached += r2.num_cached_tokens
    sched.cache.check_invariants()
    assert sched.cache.num_request_blocks == 0 and sched.cache.num_transfers_in_flight == 0
    return sched, cached


@pytest.mark.parametrize("delay", [1, 3])
@pytest.mark.parametrize("tiers", list(TIERS), ids=list(TIERS))
def test_outputs_identical_with_offload_and_transcripts_come_back(tiers, delay):
    sched, cached = replay(TIERS[tiers], delay)
    _, cached_without = replay(TIERS["none"], delay)
    stats = sched.stats()
    if tiers == "none":
        return
    promoted = sum(v for k, v in stats.items() if k.startswith("promoted_"))
    assert promoted > 0
    if tiers == "host+disk-tiny":  # too small to keep a transcript: entries cascade host -> disk -> out
        assert stats["tier_stored_disk"] > 0 and stats["tier_dropped"] > 0
        return
    assert cached > cached_without  # returning conversations hit below the GPU instead of recomputing
    if tiers == "disk":
        assert stats["promoted_blocks_disk"] > 0 and stats["promoted_blocks_host"] == 0
    if tiers == "host":
        assert stats["promoted_blocks_host"] > 0 and stats["promoted_blocks_disk"] == 0


def test_offload_threshold_by_context_length():
    sched, cached = replay(TierConfig(host_bytes=400, offload_min_tokens=10_000), 1)
    assert sum(v for k, v in sched.stats().items() if k.startswith("tier_stored")) == 0
    _, cached_without = replay(TierConfig(), 1)
    assert cached == cached_without


def test_a_request_waits_for_its_transfer_and_others_pass():
    sched = make(TIERS["host"], max_seqs=4)
    ex = SymbolicExecutor(sched, transfer_delay=5)
    first = conversations(1, seed=3)[0]
    sched.add(make_request("a", first, SamplingParams(temperature=0, max_tokens=4)))
    (a,) = ex.run()
    for i, p in enumerate(conversations(6, seed=4)):  # push it out of the GPU
        sched.add(make_request(f"x{i}", p, SamplingParams(temperature=0, max_tokens=4)))
    ex.run()
    back = first + a.output_token_ids + [1, 2]
    sched.add(make_request("back", back, SamplingParams(temperature=0, max_tokens=4)))
    sched.add(make_request("other", [5, 6, 7], SamplingParams(temperature=0, max_tokens=30)))
    order = []
    while sched.has_unfinished:
        ex._land()
        sched.transfers_done(ex.loaded)
        ex.loaded = []
        out = sched.schedule()
        order.append({s.req_id for s in out.scheduled})
        done = sched.update(out, ex.execute(out))
        for r in done:
            if r.request_id == "back":
                assert r.output_token_ids == reference_output(back, 4)
                assert r.num_cached_tokens >= len(first)
    assert "other" in order[0] and "back" not in order[0]  # waiting on its blocks; the other runs
    assert any("back" in o for o in order)
    sched.cache.check_invariants()


def test_state_unit_kinds_move_together():
    """A checkpoint inside a block stores its state and private block as one entry."""
    t = TierIndex(TierCapacity(2, 1, 0), 1, 1)

    class Tail:
        parent = None
        tokens = (1,)

    t.store_ckpt(99, Tail, slot=4, block=5, num_tokens=1, priority=HIGH)
    ops = t.take_ops()
    assert {(o.kind, o.gpu) for o in ops} == {(STATE, 4), (BLOCK, 5)}
    assert len(t.ckpts[99].units) == 2 and 99 in t.tails[None]


@pytest.mark.parametrize("tiers", ["host", "disk", "host+disk-tiny"])
def test_many_returning_conversations_at_once(tiers):
    """All second turns arrive together: promotions overlap, hold blocks for requests behind the
    queue head and compete for a GPU pool that cannot hold them all; none may stall."""
    sched = make(TIERS[tiers], num_blocks=30, max_seqs=3)
    ex = SymbolicExecutor(sched, transfer_delay=3)
    firsts = conversations(8, seed=9)
    for i, p in enumerate(firsts):
        sched.add(make_request(f"a{i}", p, SamplingParams(temperature=0, max_tokens=5)))
    outs = {r.request_id: r.output_token_ids for r in ex.run()}
    seconds = {f"b{i}": p + outs[f"a{i}"] + [i, 3] for i, p in enumerate(firsts)}
    for rid, p in seconds.items():
        sched.add(make_request(rid, p, SamplingParams(temperature=0, max_tokens=5)))
    done = {r.request_id: r for r in ex.run(max_steps=5000)}
    assert set(done) == set(seconds)  # nobody stalled
    for rid, p in seconds.items():
        assert done[rid].output_token_ids == reference_output(p, 5)
    sched.cache.check_invariants()
    assert sched.cache.num_request_blocks == 0 and sched.cache.num_transfers_in_flight == 0


def test_offload_threshold_keeps_only_long_conversations():
    sched, cached = replay(TierConfig(host_bytes=400, offload_min_tokens=48), 1)
    _, cached_all = replay(TierConfig(host_bytes=400), 1)
    _, cached_none = replay(TierConfig(), 1)
    assert cached_none < cached < cached_all  # the short conversations were recomputed
    assert sched.stats()["tier_stored_host"] > 0


def _partial_scenario(tiers: TierConfig):
    """A three-turn conversation pushed below the GPU, then its third turn arrives while a long
    request holds most of the GPU pool: the whole prefix cannot come back now."""
    sched = make(tiers, num_blocks=24, slots=6)
    ex = SymbolicExecutor(sched, transfer_delay=2)
    rng = random.Random(1)
    greedy = SamplingParams(temperature=0, max_tokens=6)
    p1 = [rng.randrange(97) for _ in range(30)]
    sched.add(make_request("a1", p1, greedy))
    (a1,) = ex.run()
    p2 = p1 + a1.output_token_ids + [rng.randrange(97) for _ in range(20)]
    sched.add(make_request("a2", p2, greedy))
    (a2,) = ex.run()
    for i, p in enumerate(conversations(6, seed=4)):  # push it off the GPU
        sched.add(make_request(f"x{i}", p, SamplingParams(temperature=0, max_tokens=4)))
    ex.run()
    hog = [rng.randrange(97) for _ in range(40)]
    sched.add(make_request("hog", hog, SamplingParams(temperature=0, max_tokens=8)))
    for _ in range(3):  # the hog is admitted and holds its blocks
        ex._land()
        sched.transfers_done(ex.loaded)
        ex.loaded = []
        out = sched.schedule()
        sched.update(out, ex.execute(out))
    p3 = p2 + a2.output_token_ids + [1, 2, 3]
    gpu_hit = sched.cache.find_hit("probe", p3).num_tokens
    sched.add(make_request("a3", p3, greedy))
    done = {r.request_id: r for r in ex.run()}
    assert done["a3"].output_token_ids == reference_output(p3, 6)  # the executor checks KV + state
    assert done["hog"].output_token_ids == reference_output(hog, 8)
    sched.cache.check_invariants()
    assert sched.cache.num_request_blocks == 0 and sched.cache.num_transfers_in_flight == 0
    return sched, done["a3"].num_cached_tokens, gpu_hit, len(p2) + len(a2.output_token_ids) - 1


def test_partial_promotion_when_the_gpu_cannot_take_the_whole_prefix():
    """The deepest prefix that fits comes back (a shallower checkpoint with all KV before it) and
    the rest is recomputed; before, the request recomputed everything past its GPU hit."""
    sched, cached, gpu_hit, whole = _partial_scenario(TierConfig(host_bytes=400))
    assert sched.stats()["promotions_partial"] >= 1
    assert gpu_hit < cached < whole  # part of the prefix came back, not all of it
    _, cached_none, _, _ = _partial_scenario(TierConfig())
    assert cached_none <= gpu_hit < cached


def push_out(sched, ex, seed=4):
    """Run other conversations until the GPU pools hold nothing of what came before."""
    for i, p in enumerate(conversations(6, seed=seed)):
        sched.add(make_request(f"push{seed}-{i}", p, SamplingParams(temperature=0, max_tokens=4)))
    ex.run()


INTERVAL_TIERS = {
    "host": TierConfig(host_bytes=400),
    "disk": TierConfig(disk_bytes=400),
    "host+disk": TierConfig(host_bytes=8, disk_bytes=400),  # two host states: pushed on to disk
}


@pytest.mark.parametrize("delay", [1, 3])
@pytest.mark.parametrize("tiers", list(INTERVAL_TIERS), ids=list(INTERVAL_TIERS))
def test_an_interval_checkpoint_below_the_gpu_serves_a_branch(tiers, delay):
    """Interval snapshots leave the GPU with their KV chain like resume points: a request sharing
    a prompt's first 35 tokens resumes at the interval checkpoint 32 from the host or disk tier."""
    sched = make(INTERVAL_TIERS[tiers])
    ex = SymbolicExecutor(sched, transfer_delay=delay)
    rng = random.Random(5)
    long = [rng.randrange(97) for _ in range(40)]  # interval 16, 32; last block 36; prompt end 40
    sched.add(make_request("long", long, SamplingParams(temperature=0, max_tokens=6)))
    ex.run()
    push_out(sched, ex)
    branch = [*long[:35], 1, 2, 3]
    assert sched.cache.find_hit("probe", branch).num_tokens == 0
    before = sched.stats()
    r = make_request("branch", branch, SamplingParams(temperature=0, max_tokens=6))
    sched.add(r)
    ex.run()
    assert r.num_cached_tokens == 32  # before interval snapshots were offloaded: 0
    assert r.output_token_ids == reference_output(branch, 6)
    tier = "host" if tiers == "host" else "disk"
    assert sched.stats()[f"promoted_ckpts_{tier}"] == before[f"promoted_ckpts_{tier}"] + 1
    sched.cache.check_invariants()
    assert sched.cache.num_request_blocks == 0 and sched.cache.num_transfers_in_flight == 0


def test_a_partial_promotion_stops_at_an_interval_checkpoint():
    """While a long prompt holds most of the GPU pool, a returning branch gets back only the
    deepest plan that fits: the interval checkpoint at 32 and its 8 blocks (48 needs 12)."""
    sched = make(TIERS["host"])
    ex = SymbolicExecutor(sched, transfer_delay=2)
    rng = random.Random(6)
    long = [rng.randrange(97) for _ in range(60)]  # interval 16, 32, 48; last block 56; end 60
    sched.add(make_request("long", long, SamplingParams(temperature=0, max_tokens=6)))
    ex.run()
    push_out(sched, ex)
    hog = make_request(
        "hog", [rng.randrange(97) for _ in range(64)], SamplingParams(temperature=0, max_tokens=1)
    )
    sched.add(hog)
    while hog.num_computed_tokens < 60:  # 15 of the 24 blocks held, the 16th taken next step
        out = sched.schedule()
        sched.update(out, ex.execute(out))
    branch = [*long[:54], 1, 2, 3]
    r = make_request("branch", branch, SamplingParams(temperature=0, max_tokens=6))
    sched.add(r)
    ex.run()
    assert sched.stats()["promotions_partial"] == 1
    assert r.num_cached_tokens == 32  # not 48, the deepest: its chain did not fit beside the hog
    assert r.output_token_ids == reference_output(branch, 6)
    assert hog.output_token_ids == reference_output(hog.prompt_token_ids, 1)
    sched.cache.check_invariants()

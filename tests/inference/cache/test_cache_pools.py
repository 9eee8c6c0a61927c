"""BlockPool and StatePool bookkeeping."""

import pytest

from inference.cache.block_pool import HIGH, LOW, BlockKey, BlockPool
from inference.cache.state_pool import StatePool


def key(tokens, parent=None, extra=()):
    return BlockKey(parent, tuple(tokens), tuple(extra))


def test_allocate_free_and_reuse():
    pool = BlockPool(4, 2)
    a = pool.allocate(3)
    assert a == [0, 1, 2] and pool.num_free == 1
    assert pool.allocate(2) is None  # short: nothing taken
    assert pool.num_free == 1
    pool.free(a)
    assert pool.num_free == 4
    pool.check_invariants()


def test_cached_block_hit_compares_tokens():
    pool = BlockPool(4, 2)
    (b,) = pool.allocate(1)
    k = key([1, 2])
    assert pool.cache(b, k) == b
    assert pool.lookup(key([1, 2])) == b
    assert pool.lookup(key([1, 3])) is None
    assert pool.lookup(key([1, 2], extra=["img"])) is None  # extra keys (image hash) count
    # same hash, different tokens: forge a collision by poisoning the map
    pool._hash_to_block[key([9, 9]).hash] = b
    assert pool.lookup(key([9, 9])) is None
    del pool._hash_to_block[key([9, 9]).hash]
    pool.check_invariants()


def test_eviction_low_before_high_and_lru_order():
    pool = BlockPool(4, 1)
    blocks = pool.allocate(4)
    for i, b in enumerate(blocks):
        pool.cache(b, key([i]))
    pool.free([blocks[0]], [HIGH])
    pool.free([blocks[1]], [LOW])
    pool.free([blocks[2]], [HIGH])
    pool.free([blocks[3]], [LOW])
    assert pool.allocate(1) == [blocks[1]]  # oldest LOW
    assert pool.allocate(1) == [blocks[3]]
    assert pool.allocate(1) == [blocks[0]]  # then oldest HIGH
    assert pool.lookup(key([2])) == blocks[2]
    assert pool.lookup(key([0])) is None
    pool.check_invariants()


def test_touch_takes_cached_block_out_of_lru():
    pool = BlockPool(2, 1)
    (b,) = pool.allocate(1)
    pool.cache(b, key([5]))
    pool.free([b])
    pool.touch([b])
    assert pool.ref_cnt[b] == 1 and pool.num_free == 1
    assert pool.allocate(1) == [1]
    pool.free([1])
    with pytest.raises(ValueError):
        pool.touch([1])  # free and uncached: nothing to share
    pool.free([b])
    with pytest.raises(ValueError):
        pool.free([1])
    pool.check_invariants()


def test_state_pool_live_and_checkpoints():
    sp = StatePool(3)
    s0 = sp.allocate_live("a")
    ck = sp.reserve_checkpoint(111, 16, LOW)
    assert ck is not None and sp.get_checkpoint(111) is None  # not written yet
    assert sp.reserve_checkpoint(111, 16, LOW) is None  # one per key
    sp.commit(111)
    assert sp.get_checkpoint(111).slot == ck.slot
    ck2 = sp.reserve_checkpoint(222, 32, HIGH)
    sp.commit(222)
    assert sp.num_free == 2  # both checkpoints are evictable
    sp.pin(111)
    s1 = sp.allocate_live("b")  # must evict 222 (111 is pinned)
    assert s1 == ck2.slot and not sp.has_checkpoint(222) and sp.has_checkpoint(111)
    assert sp.allocate_live("c") is None
    sp.unpin(111)
    assert sp.allocate_live("c") == ck.slot
    sp.free_live(s0)
    sp.check_invariants()


def test_state_pool_low_checkpoints_evicted_first():
    sp = StatePool(3)
    for k, prio in ((1, HIGH), (2, LOW), (3, HIGH)):
        sp.reserve_checkpoint(k, 16, prio)
        sp.commit(k)
    sp.allocate_live("x")
    assert not sp.has_checkpoint(2) and sp.has_checkpoint(1) and sp.has_checkpoint(3)
    sp.get_checkpoint(1)  # refresh: 3 is now the least recently used HIGH
    sp.allocate_live("y")
    assert sp.has_checkpoint(1) and not sp.has_checkpoint(3)
    sp.check_invariants()


def test_state_pool_raised_priority_outlives_low_checkpoints():
    sp = StatePool(3)
    for k in (1, 2, 3):
        sp.reserve_checkpoint(k, 16, LOW)
        sp.commit(k)
    sp.set_priority(1, HIGH)  # the oldest LOW becomes a resume point: evicted last now
    sp.allocate_live("x")
    sp.allocate_live("y")
    assert sp.has_checkpoint(1) and not sp.has_checkpoint(2) and not sp.has_checkpoint(3)
    sp.check_invariants()

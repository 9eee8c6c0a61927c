"""A request that extends a kept one (`PrefixLink`) copies that request's block keys instead of
building them, and takes over the references that one held on its blocks: the copied keys equal
freshly built ones,
hits equal an unlinked run's (without eviction; with it, held blocks outlive plain ones), every KV and
state read stays exact (symbolic executor), and a request that does not extend the kept one gets
fresh keys."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from inference.cache.block_pool import BlockKey
from inference.cache.keys import KeptKeys, extend_keys
from inference.cache.records import CacheConfig, PrefixLink
from inference.cache.tiers import TierConfig
from inference.engine.request import SamplingParams, make_request
from inference.engine.scheduler import Scheduler, SchedulerConfig
from tests.inference.engine.engine_fakes import SymbolicExecutor, reference_output

B = 4


def make(num_blocks: int = 512, kept_sets: int = 256, tiers: TierConfig | None = None) -> Scheduler:
    return Scheduler(
        SchedulerConfig(max_num_seqs=8, max_num_batched_tokens=64, max_model_len=4096),
        CacheConfig(
            block_size=B,
            num_blocks=num_blocks,
            num_state_slots=48,
            checkpoint_interval=16,
            kept_key_sets=kept_sets,
            tiers=tiers or TierConfig(),
        ),
    )


def fresh_keys(token_ids: list[int]) -> list[BlockKey]:
    keys: list[BlockKey] = []
    extend_keys(keys, token_ids, (), B)
    return keys


def record_keys(sched: Scheduler, seen: dict[str, tuple[int, list[BlockKey], list[int]]]) -> None:
    """Remember, for every request found a hit for, its linked key count and keys then."""
    cache = sched.cache
    find_hit = cache.find_hit

    def spy(req_id, token_ids, mm=()):
        hit = find_hit(req_id, token_ids, mm)
        rc = cache._reqs[req_id]
        seen.setdefault(req_id, (rc.num_linked, list(rc.keys), list(token_ids)))
        return hit

    cache.find_hit = spy


def conversations(seed: int, n_conv: int, n_turns: int):
    """Agent turns of `n_conv` interleaved conversations: (conversation, turn, prompt, shared, max_tokens),
    where each prompt starts with the first `shared` tokens of that conversation's previous prompt
    (its kept ids; the generation prompt of the previous turn is not part of them) and adds new ones."""
    rng = random.Random(seed)
    system = [rng.randrange(97) for _ in range(rng.randrange(0, 20))]
    body = {c: system + [rng.randrange(97) for _ in range(rng.randrange(1, 30))] for c in range(n_conv)}
    prev: dict[int, int] = {}
    for t in range(n_turns):
        for c in range(n_conv):
            gen = [rng.randrange(97) for _ in range(rng.randrange(0, 3))]
            yield c, t, body[c] + gen, prev.get(c, 0), rng.randrange(1, 8)
            prev[c] = len(body[c])
            body[c] = body[c] + [rng.randrange(97) for _ in range(rng.randrange(1, 40))]


def run(sched: Scheduler, workload, linked: bool) -> dict[str, int]:
    """Runs each turn of every conversation at once (so they compete for blocks), turn after turn;
    returns each request's prefix hit."""
    ex = SymbolicExecutor(sched)
    hits, expected = {}, {}
    for turn in sorted({t for _, t, *_ in workload}):
        for c, t, prompt, shared, max_tokens in workload:
            if t != turn:
                continue
            rid = f"c{c}t{t}"
            link = PrefixLink(rid, f"c{c}t{t - 1}" if t else None, shared) if linked else None
            sp = SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)
            sched.add(make_request(rid, prompt, sp, prefix_link=link))
            expected[rid] = reference_output(prompt, max_tokens)
        for req in ex.run():
            assert req.output_token_ids == expected[req.request_id]
            hits[req.request_id] = req.num_cached_tokens
    assert hits.keys() == expected.keys()
    return hits


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10_000),
    n_conv=st.integers(1, 3),
    num_blocks=st.sampled_from([512, 72]),  # 72: blocks are evicted between turns
    host_blocks=st.sampled_from([0, 24]),  # a host tier below the GPU: evicted blocks come back
)
def test_copied_keys_equal_fresh_ones_and_hits_are_unchanged(seed, n_conv, num_blocks, host_blocks):
    workload = list(conversations(seed, n_conv, 5))
    tiers = TierConfig(host_bytes=host_blocks)
    linked, plain = make(num_blocks, tiers=tiers), make(num_blocks, tiers=tiers)
    seen: dict[str, tuple[int, list[BlockKey], list[int]]] = {}
    record_keys(linked, seen)
    hits, plain_hits = run(linked, workload, linked=True), run(plain, workload, linked=False)
    if num_blocks == 512:  # without eviction the same; with it, held blocks outlive plain ones
        assert hits == plain_hits
    for rid, (num_linked, keys, token_ids) in seen.items():
        assert keys == fresh_keys(token_ids), rid
        assert all(a.hash == b.hash for a, b in zip(keys, fresh_keys(token_ids), strict=True))
        if rid.endswith("t0"):
            assert num_linked == 0
    assert linked.cache.kept.refused == 0
    if any(shared >= B for *_, shared, _ in workload):
        assert linked.cache.kept.reused > 0


def finish(ex: SymbolicExecutor, rid: str, prompt: list[int], link: PrefixLink | None) -> None:
    ex.sched.add(make_request(rid, prompt, SamplingParams(temperature=0, max_tokens=2), prefix_link=link))
    (req,) = ex.run()
    assert req.output_token_ids == reference_output(prompt, 2)


def test_a_request_that_does_not_extend_the_kept_one_gets_fresh_keys():
    sched = make()
    seen: dict[str, tuple[int, list[BlockKey], list[int]]] = {}
    record_keys(sched, seen)
    ex = SymbolicExecutor(sched)
    first = list(range(40))
    finish(ex, "a", first, PrefixLink("a"))
    assert "a" in sched.cache.kept
    other = [t + 1 for t in first] + [5, 6]
    finish(ex, "no-link", other, None)
    finish(ex, "unknown", other, PrefixLink("u", "never-kept", 40))
    # a link whose prompt does not start with the kept request's tokens: refused, not reused
    finish(ex, "wrong", other, PrefixLink("w", "a", 40))
    assert sched.cache.kept.refused == 1
    for rid in ("no-link", "unknown", "wrong"):
        num_linked, keys, token_ids = seen[rid]
        assert num_linked == 0, rid
        assert keys == fresh_keys(token_ids)
    assert "a" not in sched.cache.kept  # replaced by the keys of the request that claimed to extend it
    finish(ex, "a-again", first, PrefixLink("a"))
    finish(ex, "right", [*first, 7, 8, 9], PrefixLink("r", "a", 40))
    assert seen["right"][0] == 40 // B
    assert seen["right"][1] == fresh_keys(seen["right"][2])


def test_kept_keys_are_bounded_in_requests_and_keys():
    keys = fresh_keys(list(range(40)))  # 10 keys
    kept = KeptKeys(max_sets=2, max_blocks=15)
    kept.put("a", keys[:5])
    kept.put("b", keys[:5])
    kept.seed("a", 5, list(range(40)), B)  # refreshes "a"
    kept.put("c", keys[:5])
    assert "b" not in kept and "a" in kept and "c" in kept
    kept.put("d", keys[:10])  # 15 keys at most: "a" (least recent) goes
    assert "a" not in kept and len(kept) == 2 and kept.num_blocks == 15
    kept.put("e", keys + keys)  # more than the whole budget: not kept
    assert "e" not in kept
    assert KeptKeys(max_sets=0, max_blocks=100).seed("x", 3, [], B) == []
    kept.put("f", keys[:3], replaces="d")  # the next turn's keys take the place of those it extends
    assert "d" not in kept and kept.num_blocks == 5 + 3


def test_a_preempted_linked_request_links_again_when_readmitted():
    sched = make(num_blocks=40)
    ex = SymbolicExecutor(sched)
    finish(ex, "a", list(range(60)), PrefixLink("a"))
    sched.add(
        make_request(
            "b",
            [*range(60), 1, 2],
            SamplingParams(temperature=0, max_tokens=3),
            prefix_link=PrefixLink("b", "a", 60),
        )
    )
    out = sched.schedule()
    sched.update(out, ex.execute(out))
    sched.requeue("b")  # as after a failed step: free and recompute from the start
    assert sched.cache._links["b"].extends == "a"
    (req,) = ex.run()
    assert req.output_token_ids == reference_output([*range(60), 1, 2], 3)


def test_held_blocks_pass_to_the_next_turn_and_never_fail_an_allocation():
    sched = make(num_blocks=64)
    ex = SymbolicExecutor(sched)
    c = sched.cache
    first = list(range(90))
    finish(ex, "a", first, PrefixLink("a"))
    assert c.kept.num_held == 91 // B and c.num_request_blocks == 0  # all computed full blocks
    held = list(c.kept.held("a"))
    sched.add(make_request("b", [*first, 1, 2, 3], SamplingParams(temperature=0, max_tokens=2), prefix_link=PrefixLink("b", "a", 90)))  # fmt: skip
    out = sched.schedule()
    (s,) = out.scheduled
    assert list(s.block_ids[: 90 // B]) == held[: 90 // B]  # the very blocks, taken over
    assert c.kept.num_held == 0 and all(c.blocks.ref_cnt[b] == 1 for b in held[: 90 // B])
    sched.update(out, ex.execute(out))
    ex.run()
    assert c.kept.num_held == 94 // B and "a" not in c.kept
    # a request needing more blocks than are free beside the held ones: they are given back
    big = [t % 97 for t in range(7, 7 + 220)]
    finish(ex, "big", big, None)
    assert c.kept.num_held == 0 and "b" in c.kept  # the keys stay
    c.check_invariants()

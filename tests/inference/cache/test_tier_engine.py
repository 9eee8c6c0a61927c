"""KV and state offload through the real engine (tensors copied by `engine/tier_store.py`): with
GPU pools too small for the conversations, greedy outputs are token-identical with offload to the
host tier and to the disk tier vs no offload, and a conversation evicted to disk comes back with
its whole transcript reported as cached tokens. fp32; CPU here, the same on CUDA (gpu-marked)."""

import random

import pytest

from inference.cache.tiers import TierConfig
from inference.engine.engine import EngineConfig
from inference.engine.factory import build_engine
from inference.engine.request import SamplingParams

BASE = EngineConfig.of(
    block_size=8,
    num_blocks=40,  # 320 tokens: two or three conversations at a time
    num_state_slots=6,
    max_num_seqs=3,
    max_num_batched_tokens=96,
    max_model_len=320,
    checkpoint_interval=32,
    enable_cuda_graphs=False,
)
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
MiB = 1 << 20


def tiers(kind: str, tmp_path) -> TierConfig:
    return {
        "none": TierConfig(),
        "host": TierConfig(host_bytes=4 * MiB),
        "disk": TierConfig(disk_bytes=16 * MiB, disk_url=str(tmp_path / "kv")),
        "host+disk": TierConfig(host_bytes=MiB // 32, disk_bytes=16 * MiB, disk_url=f"file://{tmp_path}/kv2"),
        # any fsspec URL (object storage in production): fsspec's in-process memory file system
        "memory-url": TierConfig(disk_bytes=16 * MiB, disk_url=f"memory://dayzero-kv/{tmp_path.name}"),
    }[kind]


def conversations(n=6, seed=0):
    rng = random.Random(seed)
    system = [rng.randrange(256) for _ in range(40)]
    return [system + [rng.randrange(256) for _ in range(rng.randrange(50, 90))] for _ in range(n)]


def run(kind, tmp_path, device="cpu"):
    # fixed_blocks: on CUDA the planner would otherwise size the pool from free memory (no eviction)
    eng = build_engine(
        engine_config=BASE.evolve(tiers=tiers(kind, tmp_path)), device=device, fixed_blocks=True
    )
    firsts = conversations()
    outs1 = [r.output_token_ids for r in eng.generate(firsts, GREEDY)]
    seconds = [p + o + [i, 7, 8, 9, 10] for i, (p, o) in enumerate(zip(firsts, outs1, strict=True))]
    outs2, cached = [], []
    for s in seconds:  # one at a time: each comes back after the others pushed it off the pools
        (r,) = eng.generate([s], GREEDY)
        outs2.append(r.output_token_ids)
        cached.append(r.num_cached_tokens)
    eng.scheduler.cache.check_invariants()
    return (
        outs1,
        outs2,
        cached,
        eng.stats(),
        [len(p) + len(o) - 1 for p, o in zip(firsts, outs1, strict=True)],
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return run("none", tmp_path_factory.mktemp("none"))


@pytest.mark.parametrize("kind", ["host", "disk", "host+disk", "memory-url"])
def test_greedy_identical_with_offload(reference, kind, tmp_path):
    outs1, outs2, cached, stats, ends = run(kind, tmp_path)
    assert outs1 == reference[0] and outs2 == reference[1]
    assert sum(cached) > sum(reference[2])  # without tiers most transcripts were evicted
    tier = "host" if kind.startswith("host") else "disk"
    assert stats[f"promoted_blocks_{tier}"] > 0 and stats[f"promoted_ckpts_{tier}"] > 0
    # every returning conversation resumed from its end-of-generation checkpoint
    assert cached == ends, (cached, ends)
    if kind == "host+disk":
        assert stats["tier_stored_disk"] > 0 and stats["promoted_blocks_disk"] > 0


def test_conversation_evicted_to_disk_resumes_with_cached_tokens(tmp_path):
    eng = build_engine(engine_config=BASE.evolve(tiers=tiers("disk", tmp_path)))
    first = conversations(1, seed=5)[0]
    (a,) = eng.generate([first], GREEDY)
    eng.generate(conversations(5, seed=6), GREEDY)  # pushes it off the GPU pools
    eng.runner.tier_store.flush()
    assert list((tmp_path / "kv").iterdir())  # on disk now
    assert eng.scheduler.cache.find_hit("probe", first + a.output_token_ids + [1]).num_tokens == 0
    (b,) = eng.generate([first + a.output_token_ids + [1, 2, 3]], GREEDY)
    assert b.num_cached_tokens == len(first) + len(a.output_token_ids) - 1
    plain = build_engine(engine_config=BASE)
    (ref,) = plain.generate([first + a.output_token_ids + [1, 2, 3]], GREEDY)
    assert b.output_token_ids == ref.output_token_ids


def interval_branch(kind: str, tmp_path, device: str = "cpu") -> None:
    """A request sharing a long prompt's start up to just past an interval multiple (128) resumes
    from that interval checkpoint, brought back with its KV chain from the host or disk tier (the
    prompt's resume points, at 144 and beyond, are too deep for it); fp32 greedy output equal to a
    cache-less engine's."""
    cfg = BASE.evolve(tiers=tiers(kind, tmp_path))
    eng = build_engine(engine_config=cfg, device=device, fixed_blocks=True)
    rng = random.Random(8)
    long = [rng.randrange(256) for _ in range(150)]  # interval checkpoints 32..128, the last block's 144
    eng.generate([long], GREEDY)
    eng.generate(conversations(5, seed=6), GREEDY)  # pushes it off the GPU pools
    branch = [*long[:140], 1, 2, 3, 4, 5]
    assert eng.scheduler.cache.find_hit("probe", branch).num_tokens == 0, kind  # nothing left on the GPU
    before = eng.stats()
    (b,) = eng.generate([branch], GREEDY)
    assert b.num_cached_tokens == 128, kind  # before interval checkpoints were offloaded: 0
    # with a 1/32 MiB host tier (host+disk) the interval snapshot had moved on to disk
    tier = "host" if kind == "host" else "disk"
    assert eng.stats()[f"promoted_ckpts_{tier}"] == before[f"promoted_ckpts_{tier}"] + 1, kind
    (ref,) = build_engine(engine_config=BASE, device=device, fixed_blocks=True).generate([branch], GREEDY)
    assert b.output_token_ids == ref.output_token_ids, kind
    eng.scheduler.cache.check_invariants()


@pytest.mark.parametrize("kind", ["host", "disk", "host+disk"])
def test_an_interval_checkpoint_from_a_lower_tier_serves_a_branch(kind, tmp_path):
    interval_branch(kind, tmp_path)


@pytest.mark.gpu
def test_gpu_interval_checkpoint_from_a_lower_tier_fp32(tmp_path):
    for kind in ("host", "disk", "host+disk"):
        interval_branch(kind, tmp_path / kind, device="cuda")


@pytest.mark.gpu
def test_gpu_offload_token_identical_fp32(tmp_path):
    ref = run("none", tmp_path / "ref", device="cuda")
    for kind in ("host", "disk", "host+disk"):
        outs1, outs2, cached, stats, ends = run(kind, tmp_path / kind, device="cuda")
        assert outs1 == ref[0] and outs2 == ref[1], kind
        assert cached == ends and sum(cached) > sum(ref[2]), kind
        assert stats[f"promoted_blocks_{kind.split('+')[-1]}"] > 0, kind


def test_a_step_failing_before_its_promotion_starts_undoes_it(tmp_path):
    """The runner fails in the tier copies of the step that would start a promotion: the engine's
    recovery undoes the promotion (no transfer is left that never runs) and drops the tier entries
    that step may have left unwritten. A failure in a step that ran no request is the engine's own,
    so the waiting request fails; sent again, it answers right."""
    eng = build_engine(engine_config=BASE.evolve(tiers=tiers("host", tmp_path)), fixed_blocks=True)
    first = conversations(1, seed=5)[0]
    (a,) = eng.generate([first], GREEDY)
    eng.generate(conversations(5, seed=6), GREEDY)
    store, real = eng.runner.tier_store, eng.runner.tier_store.apply
    failed = []

    def apply(ops):
        if eng.runner.unstarted and not failed:
            failed.append(True)
            raise RuntimeError("disk on fire")
        real(ops)

    store.apply = apply
    back = first + a.output_token_ids + [1, 2, 3]
    rid = eng.add_request(back, GREEDY)
    with pytest.raises(RuntimeError):
        while eng.has_unfinished:
            eng.step()
    assert failed and eng.recover_after_failed_step() == [rid]
    assert eng.scheduler.num_transfers_in_flight == 0 and not eng.has_unfinished
    eng.scheduler.cache.check_invariants()
    assert eng.scheduler.cache.num_request_blocks == 0
    (again,) = eng.generate([back], GREEDY)
    (ref,) = build_engine(engine_config=BASE).generate([back], GREEDY)
    assert again.output_token_ids == ref.output_token_ids


def test_partial_promotion_token_identical(tmp_path):
    """The real engine, fp32: a conversation's third turn comes back while a long request holds
    most of the GPU pool, so only the deepest prefix that fits is promoted (KV chain and the
    checkpoint ending it) and the rest recomputed; its greedy output equals a cache-less run's."""
    eng = build_engine(engine_config=BASE.evolve(tiers=tiers("host", tmp_path)), fixed_blocks=True)
    rng = random.Random(3)
    p1 = [rng.randrange(256) for _ in range(60)]
    (a1,) = eng.generate([p1], GREEDY)
    p2 = p1 + a1.output_token_ids + [rng.randrange(256) for _ in range(40)]
    (a2,) = eng.generate([p2], GREEDY)
    eng.generate(conversations(5, seed=6), GREEDY)  # pushes it off the GPU pools
    hog = [rng.randrange(256) for _ in range(220)]
    hog_id = eng.add_request(hog, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    outs: dict[str, list[int]] = {}
    cached = {}
    while eng.get_request(hog_id).num_computed_tokens < len(hog):  # its prompt holds the pool
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
    p3 = p2 + a2.output_token_ids + [1, 2, 3]
    gpu_hit = eng.scheduler.cache.find_hit("probe", p3).num_tokens
    rid = eng.add_request(p3, GREEDY)
    while eng.has_unfinished:
        for o in eng.step():
            outs.setdefault(o.request_id, []).extend(o.new_token_ids)
            cached[o.request_id] = o.num_cached_tokens
    stats = eng.stats()
    assert stats["promotions_partial"] >= 1 and gpu_hit < cached[rid] < len(p2) + len(a2.output_token_ids) - 1
    plain = build_engine(engine_config=BASE)
    (ref3,) = plain.generate([p3], GREEDY)
    (ref_hog,) = plain.generate([hog], SamplingParams(temperature=0, max_tokens=12, ignore_eos=True))
    assert outs[rid] == ref3.output_token_ids and outs[hog_id] == ref_hog.output_token_ids
    eng.scheduler.cache.check_invariants()

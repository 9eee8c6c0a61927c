"""KV offload tiers under TP / EP (gloo ranks): the driver's one tier index decides, every rank
moves its own shard. With GPU pools too small for the conversations, greedy fp32 outputs are
TP=1's without offload, every returning conversation resumes from its end-of-generation
checkpoint (its transcript reported as cached tokens), and a killed rank still fails the engine
quickly, its disk folder removed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from inference.cache.tiers import TierConfig
from inference.engine.factory import build_engine
from inference.parallel import WorkerFailedError
from tests.inference.cache.test_tier_engine import BASE, GREEDY, MiB, conversations

# host and disk sizes are the host's, split over the ranks (`launch.rank_tiers`)
TIERS = {
    "host": lambda tmp: TierConfig(host_bytes=8 * MiB),
    # a host tier of a few blocks per rank: most of it goes on to disk
    "host+disk": lambda tmp: TierConfig(
        host_bytes=MiB // 16, disk_bytes=32 * MiB, disk_url=f"file://{tmp}/kv"
    ),
    "disk": lambda tmp: TierConfig(disk_bytes=32 * MiB, disk_url=str(tmp / "kv")),
}


def run(engine) -> tuple[list[list[int]], list[list[int]], list[int], dict, list[int]]:
    """Both rounds (the second one conversation at a time, each after the others pushed it off
    the GPU pools): tokens, cached tokens of the second round, stats, and each transcript's end."""
    firsts = conversations()
    outs1 = [r.output_token_ids for r in engine.generate(firsts, GREEDY)]
    seconds = [p + o + [i, 7, 8, 9, 10] for i, (p, o) in enumerate(zip(firsts, outs1, strict=True))]
    outs2, cached = [], []
    for s in seconds:
        (r,) = engine.generate([s], GREEDY)
        outs2.append(r.output_token_ids)
        cached.append(r.num_cached_tokens)
    engine.scheduler.cache.check_invariants()
    ends = [len(p) + len(o) - 1 for p, o in zip(firsts, outs1, strict=True)]
    return outs1, outs2, cached, engine.stats(), ends


@pytest.fixture(scope="module")
def reference():
    """TP=1, no offload."""
    return run(build_engine(engine_config=BASE))


@pytest.mark.parametrize(
    ("kind", "tp", "ep"),
    [("host+disk", 2, 1), ("disk", 2, 1), ("host", 1, 2)],
    ids=["tp2-host+disk", "tp2-disk", "ep2-host"],
)
def test_parallel_offload_greedy_matches_tp1(reference, kind: str, tp: int, ep: int, tmp_path: Path) -> None:
    engine = build_engine(
        engine_config=BASE.evolve(tiers=TIERS[kind](tmp_path)),
        tensor_parallel_size=tp,
        expert_parallel_size=ep,
    )
    try:
        outs1, outs2, cached, stats, ends = run(engine)
    finally:
        engine.runner.close()
    assert outs1 == reference[0] and outs2 == reference[1]
    assert cached == ends, (cached, ends)  # each came back whole from the tiers
    assert sum(cached) > sum(reference[2])  # without tiers most transcripts were evicted
    for tier in ("host", "disk") if kind == "host+disk" else (kind,):
        assert stats[f"promoted_blocks_{tier}"] > 0 and stats[f"promoted_ckpts_{tier}"] > 0, (tier, stats)
    if kind != "host":  # every rank wrote its own shard, under its own folder
        for rank in range(tp * ep):
            assert list((tmp_path / "kv" / f"rank{rank}").iterdir()), rank


def test_killed_worker_with_tiers_fails_the_engine_fast() -> None:
    engine = build_engine(
        engine_config=BASE.evolve(tiers=TierConfig(disk_bytes=32 * MiB)), tensor_parallel_size=2
    )
    runner = engine.runner
    try:
        folder = Path(runner._tmp.name)  # the default disk folder, the driver's
        first = conversations(1, seed=5)[0]
        (a,) = engine.generate([first], GREEDY)
        engine.generate(conversations(5, seed=6), GREEDY)  # pushes it off to disk
        assert engine.stats()["tier_stored_disk"] > 0
        engine.add_request(first + a.output_token_ids + [1, 2, 3], GREEDY)  # its promotion next
        os.kill(runner.pids[1], signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError, match="rank 1"):
            while engine.has_unfinished:
                engine.step()
        assert time.monotonic() - t0 < 10
    finally:
        runner.close()
    assert not folder.exists()  # removed by the driver although a rank was killed

"""KV offload tiers under TP / EP (gloo ranks): the driver's one tier index decides, every rank
moves its own shard. With GPU pools too small for the conversations, greedy fp32 outputs are
TP=1's without offload, every returning conversation resumes from its end-of-generation
checkpoint (its transcript reported as cached tokens), and a killed rank still fails the engine
quickly, its disk folder removed. A promotion that fails on every rank before it starts is undone
as at TP=1; one failing on one rank only fails the engine (the ranks' tiers have diverged)."""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from inference.cache.tiers import TierConfig
from inference.config import parse_config
from inference.engine.factory import build_engine, small_model_config
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel import StepFailedError, WorkerFailedError
from inference.parallel.launch import build_parallel_engine
from inference.tokenizer import ByteTokenizer
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


def _fail_first_promotion(model: nn.Module, rank: int, *, ranks: tuple[int, ...], armed: str) -> None:
    """A rank hook (picklable through `functools.partial`): on `ranks`, once the file `armed`
    exists (the driver creates it when the setup is done: the setup's own conversations may
    promote too), the first step that would start a promotion raises in the tier copies, before
    starting it."""
    if rank not in ranks:
        return
    from inference.engine.tier_store import TierStore

    real, failed = TierStore.start, []

    def start(self: TierStore, transfers: list) -> None:
        if transfers and not failed and os.path.exists(armed):
            failed.append(True)
            raise RuntimeError(f"tier copy failed on rank {rank}")
        real(self, transfers)

    TierStore.start = start


def _evicted_engine(ranks: tuple[int, ...], folder: Path):
    """TP=2 with a host tier, one conversation evicted to it; the conversation's return next, with
    the failing promotion armed."""
    spec = parse_config(small_model_config())
    armed = folder / "armed"
    engine = build_parallel_engine(
        spec, ByteTokenizer(), HybridCacheSpec.from_model_spec(spec, torch.float32),
        BASE.evolve(tiers=TIERS["host"](None)), tensor_parallel_size=2, expert_parallel_size=1,
        model_dir=None, device=torch.device("cpu"), dtype=torch.float32, seed=0,
        rank_hook=functools.partial(_fail_first_promotion, ranks=ranks, armed=str(armed)),
    )  # fmt: skip
    first = conversations(1, seed=5)[0]
    (a,) = engine.generate([first], GREEDY)
    engine.generate(conversations(5, seed=6), GREEDY)
    armed.touch()
    return engine, first + a.output_token_ids + [1, 2, 3]


def test_a_step_failing_on_every_rank_before_its_promotion_undoes_it(tmp_path: Path) -> None:
    """Every rank fails the step that starts the promotion (before starting it): the engine
    undoes the promotion, fails the request (the step ran no other), and the ranks stay up: sent
    again, the request gives the TP=1 tokens."""
    engine, back = _evicted_engine(ranks=(0, 1), folder=tmp_path)
    try:
        rid = engine.add_request(back, GREEDY)
        with pytest.raises(StepFailedError, match="tier copy failed"):
            while engine.has_unfinished:
                engine.step()
        assert engine.runner.unstarted  # the ranks agreed on the promotion they never started
        assert engine.recover_after_failed_step() == [rid]
        assert engine.scheduler.num_transfers_in_flight == 0 and not engine.has_unfinished
        engine.scheduler.cache.check_invariants()
        (again,) = engine.generate([back], GREEDY)
    finally:
        engine.runner.close()
    (ref,) = build_engine(engine_config=BASE).generate([back], GREEDY)
    assert again.output_token_ids == ref.output_token_ids


def test_a_promotion_failing_on_one_rank_only_fails_the_engine(tmp_path: Path) -> None:
    engine, back = _evicted_engine(ranks=(1,), folder=tmp_path)
    try:
        engine.add_request(back, GREEDY)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError, match="diverged"):
            while engine.has_unfinished:
                engine.step()
        assert time.monotonic() - t0 < 10
    finally:
        engine.runner.close()


@pytest.mark.gpu
def test_nccl_offload_matches_tp1_on_gpus(tmp_path: Path) -> None:
    """The same check on 2 GPUs (NCCL, side-stream promotions), fp32, against TP=1 on a GPU; the
    multi-GPU issues run it."""
    if torch.cuda.device_count() < 2:
        pytest.skip(f"needs 2 GPUs, this host has {torch.cuda.device_count()}")
    reference = run(build_engine(engine_config=BASE, device="cuda", fixed_blocks=True))
    engine = build_engine(
        engine_config=BASE.evolve(tiers=TIERS["host+disk"](tmp_path)), device="cuda", fixed_blocks=True,
        tensor_parallel_size=2,
    )  # fmt: skip
    try:
        outs1, outs2, cached, stats, ends = run(engine)
    finally:
        engine.runner.close()
    assert outs1 == reference[0] and outs2 == reference[1] and cached == ends
    assert stats["promoted_blocks_host"] > 0 and stats["promoted_blocks_disk"] > 0

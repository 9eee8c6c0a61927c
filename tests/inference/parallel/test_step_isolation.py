"""A step that raises under TP/EP fails only the request that broke it, as at world size 1
(`Engine.recover_after_failed_step`), when every rank raised it; a step that raised on only some
ranks still fails the engine (`WorkerFailedError`), quickly and saying which ranks diverged."""

from __future__ import annotations

import functools
import time

import pytest
import torch
from torch import nn

from inference.config import parse_config
from inference.engine.engine import Engine
from inference.engine.factory import build_engine, small_model_config
from inference.engine.request import Request, SamplingParams
from inference.model.cache_tensors import HybridCacheSpec
from inference.parallel import StepFailedError, WorkerFailedError
from inference.parallel.launch import build_parallel_engine
from inference.tokenizer import ByteTokenizer
from tests.inference.parallel.test_parallel_engine import CONFIG, GREEDY, ROUND1, ROUND2


class PoisonedStep(RuntimeError):
    """What the test model raises in a step that holds the marker token."""


def _poison(model: nn.Module, rank: int, *, marker: int, ranks: tuple[int, ...], where: str) -> None:
    """A rank hook (picklable through `functools.partial`): on `ranks`, a forward whose input
    ids hold `marker` raises, either in the last layer's mixer (`"mid"`: after the earlier
    layers' collectives, before that layer's) or after the whole forward (`"after"`: all of the
    step's collectives done)."""
    if rank not in ranks:
        return
    seen = {"marker": False}

    def look(module: nn.Module, args: tuple) -> None:
        seen["marker"] = bool((args[0] == marker).any())

    def fail(*_: object) -> None:
        if seen["marker"]:
            raise PoisonedStep(f"marker token {marker} in the step (rank {rank}, {where})")

    model.register_forward_pre_hook(look)
    if where == "mid":
        model.model.layers[-1].self_attn.register_forward_pre_hook(fail)
    else:
        model.register_forward_hook(fail)


def _engine(tp: int, ep: int, hook: functools.partial | None) -> Engine:
    spec = parse_config(small_model_config())
    return build_parallel_engine(
        spec, ByteTokenizer(), HybridCacheSpec.from_model_spec(spec, torch.float32), CONFIG,
        tensor_parallel_size=tp, expert_parallel_size=ep, model_dir=None, device=torch.device("cpu"),
        dtype=torch.float32, seed=0, rank_hook=hook,
    )  # fmt: skip


def _drive(engine: Engine, prompts: list[list[int]], params: list[SamplingParams]) -> tuple[dict, list, list]:
    """Step to the end, recovering from failed steps as the async engine does: the finished
    requests' tokens by id, the ids that failed, the step errors."""
    rids = [engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
    reqs: dict[str, Request] = {rid: engine.scheduler.requests[rid] for rid in rids}
    done: dict[str, list[int]] = {}
    failed: list[str] = []
    errors: list[StepFailedError] = []
    while engine.has_unfinished:
        try:
            outputs = engine.step()
        except StepFailedError as exc:
            errors.append(exc)
            failed += engine.recover_after_failed_step()
            continue
        for o in outputs:
            if o.finished:
                done[o.request_id] = reqs[o.request_id].output_token_ids
    return done, failed, errors


@pytest.fixture(scope="module")
def reference() -> tuple[list[list[int]], list[list[int]]]:
    """TP=1 greedy tokens of both rounds, without the poisoned request."""
    engine = build_engine(engine_config=CONFIG)
    first = [r.output_token_ids for r in engine.generate(ROUND1, GREEDY)]
    return first, [r.output_token_ids for r in engine.generate(ROUND2, GREEDY)]


def _marker(reference) -> int:
    """A token id in no prompt and no reference output: only the poisoned prompt holds it."""
    used = {t for p in ROUND1 + ROUND2 for t in p} | {t for r in reference for o in r for t in o}
    return min(set(range(1, 256)) - used)


# (tp, ep, how the poisoned request breaks its steps)
CASES = {
    "tp2-forward": (2, 1, "mid"),
    "ep2-forward": (1, 2, "mid"),
    "tp2-sampler": (2, 1, "sampler"),  # an invalid seed: the sampler raises after the forward
}


@pytest.mark.parametrize("case", list(CASES))
def test_poisoned_request_fails_alone(reference, case: str) -> None:
    tp, ep, how = CASES[case]
    marker = _marker(reference)
    hook = None
    bad_params = GREEDY
    if how == "sampler":
        bad_params = SamplingParams(temperature=1.0, max_tokens=6)
        object.__setattr__(bad_params, "seed", 2**70)  # past validation: the seeded generator raises
    else:
        hook = functools.partial(_poison, marker=marker, ranks=tuple(range(tp * ep)), where=how)
    engine = _engine(tp, ep, hook)
    runner = engine.runner
    try:
        if how == "sampler":
            # short, first in line: its first step samples (and fails), batched and then alone
            # (a failure in a later chunk is isolated too: tests/inference/engine/test_failure_isolation.py)
            prompts = [ROUND1[2][:10], ROUND1[0], ROUND1[1], ROUND1[2]]
            params = [bad_params, GREEDY, GREEDY, GREEDY]
        else:
            # the marker's chunk fails in every batch it joins, then alone
            poisoned = [*ROUND1[1][:30], marker, *ROUND1[1][30:]]
            prompts = [ROUND1[0], poisoned, ROUND1[1], ROUND1[2]]
            params = [GREEDY, bad_params, GREEDY, GREEDY]
        done, failed, errors = _drive(engine, prompts, params)
        assert len(failed) == 1 and failed[0] not in done
        assert errors and all("every parallel rank" in str(e) for e in errors)
        want = "PoisonedStep: marker token" if how != "sampler" else "Error"
        assert want in str(errors[-1])
        assert [done[r] for r in sorted(done, key=lambda r: int(r.split("-")[1]))] == reference[0]
        assert runner.failure is None and all(p.is_alive() for p in runner.procs)
        # the engine goes on: a later round decodes as at TP=1, hitting the prefix cache again
        second = engine.generate(ROUND2, GREEDY)
        assert [r.output_token_ids for r in second] == reference[1]
        assert all(r.num_cached_tokens > 0 for r in second)
    finally:
        runner.close()


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("mid", "out of step"),  # rank 0 then waits in the layer's collective: the timeout tells
        ("after", r"raised on ranks \[1\] but not on \[0\]"),  # rank 0 finished the step
    ],
)
def test_step_failing_on_one_rank_fails_the_engine(reference, where: str, message: str) -> None:
    marker = _marker(reference)
    engine = _engine(2, 1, functools.partial(_poison, marker=marker, ranks=(1,), where=where))
    runner = engine.runner
    runner.agree_timeout_s = 3.0
    try:
        engine.add_request(ROUND1[0] + [marker], GREEDY)
        t0 = time.monotonic()
        with pytest.raises(WorkerFailedError, match=message) as info:
            while engine.has_unfinished:
                engine.step()
        assert time.monotonic() - t0 < 10
        assert "PoisonedStep" in str(info.value) or "rank 1 failed" in str(info.value)
        with pytest.raises(WorkerFailedError):  # no recovery from diverged ranks
            engine.recover_after_failed_step()
        for p in runner.procs:
            p.join(5)
            assert not p.is_alive()
    finally:
        runner.close()

"""The retry rule (`orchestrator.retry`); the runner applying it is tested in test_runner and
test_side_effects."""

from __future__ import annotations

import random

import pytest

from orchestrator.probes import Backoff
from orchestrator.retry import backoff_cap_s, decide, decide_tool, full_jitter_s
from tools.base import (
    InvalidArgumentsError,
    PermanentToolError,
    RetryableToolError,
    RetryPolicy,
    ToolError,
    ToolSpec,
    ToolTimeoutError,
)


def spec(**kw: object) -> ToolSpec:
    return ToolSpec(name="t", description="", parameters={"type": "object"}, **kw)  # type: ignore[arg-type]


def should_retry(s: ToolSpec, error: ToolError, attempt: int) -> bool:
    return decide_tool(s, error, attempt).retry


def test_transient_failure_retried_until_attempts_run_out() -> None:
    s = spec(retry=RetryPolicy(max_attempts=3))
    assert should_retry(s, RetryableToolError("flaky"), attempt=1)
    assert should_retry(s, RetryableToolError("flaky"), attempt=2)
    assert not should_retry(s, RetryableToolError("flaky"), attempt=3)
    assert decide_tool(s, RetryableToolError("flaky"), attempt=3).exhausted


def test_permanent_and_invalid_never_retried() -> None:
    s = spec()
    assert not should_retry(s, PermanentToolError("no"), attempt=1)
    assert not should_retry(s, InvalidArgumentsError("bad"), attempt=1)
    assert not decide_tool(s, PermanentToolError("no"), attempt=3).exhausted


def test_timeouts_follow_the_policy() -> None:
    assert should_retry(spec(), ToolTimeoutError("slow"), attempt=1)
    assert not should_retry(
        spec(retry=RetryPolicy(retry_on_timeout=False)), ToolTimeoutError("slow"), attempt=1
    )


def test_non_idempotent_tool_not_retried_once_it_may_have_started() -> None:
    s = spec(idempotent=False)
    assert not should_retry(s, RetryableToolError("reset mid-request"), attempt=1)
    assert not should_retry(s, ToolTimeoutError("slow"), attempt=1)
    # it failed before touching anything: safe to try again
    assert should_retry(s, RetryableToolError("connect refused", started=False), attempt=1)
    # with an idempotency key the tool recognises the repeat itself
    assert should_retry(
        spec(idempotent=False, accepts_idempotency_key=True), ToolTimeoutError("slow"), attempt=1
    )


def test_started_survives_the_job_outcome() -> None:
    # The worker sends `to_dict()`; the runner decides on `from_dict()` of it.
    s = spec(idempotent=False)
    for err in (RetryableToolError("refused", started=False), RetryableToolError("reset")):
        back = ToolError.from_dict(err.to_dict())
        assert (back.kind, back.started, str(back)) == (err.kind, err.started, str(err))
        assert should_retry(s, back, attempt=1) is (err.started is False)


def test_unknown_kind_is_not_retried() -> None:
    assert not decide(RetryPolicy(), "gremlins", attempt=1).retry


@pytest.mark.parametrize("attempt", [1, 2, 5, 20])
def test_backoff_full_jitter_is_capped(attempt: int) -> None:
    p = RetryPolicy(backoff_base_s=0.5, backoff_max_s=4.0)
    rng = random.Random(0)
    values = [full_jitter_s(attempt, p.backoff_base_s, p.backoff_max_s, rng) for _ in range(200)]
    cap = min(4.0, 0.5 * 2 ** (attempt - 1))
    assert all(0 <= v <= cap for v in values)
    assert max(values) > cap * 0.8
    d = decide(RetryPolicy(max_attempts=99, backoff_base_s=0.5, backoff_max_s=4.0), "retryable", attempt)
    assert d.cap_s == cap and 0 <= d.delay_s <= cap


def test_outage_backoff_waits_the_same_cap_without_jitter() -> None:
    b = Backoff(base_s=0.5, max_s=30.0)
    assert [b.next_delay() for _ in range(8)] == [backoff_cap_s(n, 0.5, 30.0) for n in range(1, 9)]
    assert backoff_cap_s(8, 0.5, 30.0) == 30.0

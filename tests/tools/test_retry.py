"""Retry decisions from a tool's declared policy (the runner's loop is tested by the orchestrator)."""

from __future__ import annotations

import random

import pytest

from tools.base import (
    InvalidArgumentsError,
    PermanentToolError,
    RetryableToolError,
    RetryPolicy,
    ToolSpec,
    ToolTimeoutError,
)
from tools.retry import backoff_s, should_retry


def spec(**kw: object) -> ToolSpec:
    return ToolSpec(name="t", description="", parameters={"type": "object"}, **kw)  # type: ignore[arg-type]


def test_transient_failure_retried_until_attempts_run_out() -> None:
    s = spec(retry=RetryPolicy(max_attempts=3))
    assert should_retry(s, RetryableToolError("flaky"), attempt=1)
    assert should_retry(s, RetryableToolError("flaky"), attempt=2)
    assert not should_retry(s, RetryableToolError("flaky"), attempt=3)


def test_permanent_and_invalid_never_retried() -> None:
    s = spec()
    assert not should_retry(s, PermanentToolError("no"), attempt=1)
    assert not should_retry(s, InvalidArgumentsError("bad"), attempt=1)


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


@pytest.mark.parametrize("attempt", [1, 2, 5, 20])
def test_backoff_full_jitter_is_capped(attempt: int) -> None:
    p = RetryPolicy(backoff_base_s=0.5, backoff_max_s=4.0)
    rng = random.Random(0)
    values = [backoff_s(p, attempt, rng) for _ in range(200)]
    cap = min(4.0, 0.5 * 2 ** (attempt - 1))
    assert all(0 <= v <= cap for v in values)
    assert max(values) > cap * 0.8

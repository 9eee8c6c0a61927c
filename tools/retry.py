"""Retry decisions from a tool's declared policy (pure functions; the runner owns the loop).

The rule the issue asks for: a transient failure is retried per the tool's `RetryPolicy`; a
non-idempotent tool is never retried once it may have started, unless it accepts an idempotency key
(it then recognises the repeated call itself).
"""

from __future__ import annotations

import random

from tools.base import ErrorKind, RetryPolicy, ToolError, ToolSpec


def should_retry(spec: ToolSpec, error: ToolError, attempt: int) -> bool:
    """Whether attempt number `attempt` (1-based) that failed with `error` gets another try."""
    if attempt >= spec.retry.max_attempts:
        return False
    if error.kind in (ErrorKind.PERMANENT, ErrorKind.INVALID_ARGUMENTS):
        return False
    if error.kind is ErrorKind.TIMEOUT and not spec.retry.retry_on_timeout:
        return False
    may_have_started = error.started is not False
    return not (may_have_started and not spec.idempotent and not spec.accepts_idempotency_key)


def backoff_s(policy: RetryPolicy, attempt: int, rng: random.Random | None = None) -> float:
    """Exponential backoff with full jitter before attempt `attempt + 1`."""
    cap = min(policy.backoff_max_s, policy.backoff_base_s * (2 ** max(0, attempt - 1)))
    return (rng or random).uniform(0.0, cap)

"""The retry rule: whether a failed attempt runs again, and after how long (pure functions).

One place for the decision the runner makes for tool steps, model steps and attachment
preprocessing, and the service's one backoff formula (`core.backoff.backoff_cap_s`; the outage
loops wait exactly the cap, attempts wait a full-jitter draw below it).

The rule: a transient failure (retryable, or a timeout where the policy retries timeouts) is
retried while attempts remain, except that an attempt that may have started its side effect is
never repeated unless repeating is safe (the work is idempotent, or it dedupes on the
idempotency key). A failure that says `started=False` happened before anything was touched.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from core.backoff import backoff_cap_s
from core.retry import RetryPolicy
from tools.base import ErrorKind, ToolError, ToolSpec

__all__ = ["Decision", "backoff_cap_s", "decide", "decide_tool", "full_jitter_s"]


@dataclass(frozen=True, slots=True)
class Decision:
    retry: bool
    delay_s: float = 0.0  # wait before the next attempt (when `retry`)
    cap_s: float = 0.0  # the ceiling `delay_s` was drawn below
    # Transient and safe to repeat, but out of attempts: `RetryPolicy.fail_task_on_exhaustion`
    # then fails the task instead of showing the model the error.
    exhausted: bool = False


def full_jitter_s(attempt: int, base_s: float, max_s: float, rng: random.Random | None = None) -> float:
    """A wait drawn uniformly below `backoff_cap_s` (full jitter: retries of many tasks spread out)."""
    return (rng or random).uniform(0.0, backoff_cap_s(attempt, base_s, max_s))


def decide(
    policy: RetryPolicy,
    kind: ErrorKind | str,
    attempt: int,
    *,
    started: bool | None = None,
    safe_to_repeat: bool = True,
    rng: random.Random | None = None,
) -> Decision:
    """What to do after attempt number `attempt` (1-based) failed with an error of `kind`.

    `started` is the failure's own word on whether the side effect may have begun (None =
    unknown, treated as yes); `safe_to_repeat` whether running it twice is harmless."""
    try:
        kind = ErrorKind(kind)
    except ValueError:  # a kind this version does not know is not worth a second try
        kind = ErrorKind.PERMANENT
    transient = kind is ErrorKind.RETRYABLE or (kind is ErrorKind.TIMEOUT and policy.retry_on_timeout)
    if not transient or not (safe_to_repeat or started is False):
        return Decision(retry=False)
    if attempt >= policy.max_attempts:
        return Decision(retry=False, exhausted=True)
    cap = backoff_cap_s(attempt, policy.backoff_base_s, policy.backoff_max_s)
    return Decision(retry=True, delay_s=(rng or random).uniform(0.0, cap), cap_s=cap)


def decide_tool(spec: ToolSpec, error: ToolError, attempt: int, rng: random.Random | None = None) -> Decision:
    """`decide` for a tool attempt: the tool's policy, and whether the tool is safe to run twice."""
    return decide(
        spec.retry,
        error.kind,
        attempt,
        started=error.started,
        safe_to_repeat=spec.idempotent or spec.accepts_idempotency_key,
        rng=rng,
    )

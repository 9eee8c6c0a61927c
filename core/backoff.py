"""The one backoff formula: the retry rule draws attempts' waits below it (full jitter), the
outage loops wait exactly it."""

from __future__ import annotations

from dataclasses import dataclass


def backoff_cap_s(attempt: int, base_s: float, max_s: float) -> float:
    """Ceiling of the wait after failure number `attempt` (1-based): base * 2**(attempt-1), capped."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    return min(max_s, base_s * 2 ** min(attempt - 1, 30))


@dataclass(slots=True)
class Backoff:
    """Exponential backoff between attempts at a dependency: base * 2^n, capped."""

    base_s: float = 0.5
    max_s: float = 30.0
    failures: int = 0

    def next_delay(self) -> float:
        self.failures += 1
        return backoff_cap_s(self.failures, self.base_s, self.max_s)  # no jitter: one process waits

    def reset(self) -> None:
        self.failures = 0

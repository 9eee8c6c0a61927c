"""Backoff: exponential with full jitter (delay drawn uniformly from [0, min(cap, base * 2**n)])."""

from __future__ import annotations

import random


def full_jitter_delay(attempt: int, base_s: float, cap_s: float, rng: random.Random | None = None) -> float:
    """Delay before retry number `attempt` (1 = the first retry)."""
    if attempt < 1:
        raise ValueError("attempt counts from 1")
    ceiling = min(cap_s, base_s * (2 ** (attempt - 1)))
    return (rng or random).uniform(0.0, ceiling)

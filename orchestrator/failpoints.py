"""Fault injection for crash tests: `DAYZERO_FAILPOINTS="before_commit=0.05,after_commit=0.05"`
kills this process with SIGKILL at the named point with the given probability.

Read once from the environment at import (a test hook, deliberately outside `Settings`); with the
variable unset every `failpoint()` call is a dictionary lookup that does nothing.
"""

from __future__ import annotations

import os
import random
import signal


def _parse(spec: str) -> dict[str, float]:
    points: dict[str, float] = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        name, _, prob = item.partition("=")
        points[name] = float(prob or 1.0)
    return points


_POINTS = _parse(os.environ.get("DAYZERO_FAILPOINTS", ""))


def failpoint(name: str) -> None:
    """Die here (SIGKILL, no cleanup) if this failpoint is armed and the dice say so."""
    p = _POINTS.get(name)
    if p is not None and random.random() < p:
        os.kill(os.getpid(), signal.SIGKILL)

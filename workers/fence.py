"""The late-duplicate check of tool jobs: run a job only while its attempt is still current.

At-least-once delivery redelivers a job whose worker died before the ack: at once on RabbitMQ,
after the visibility timeout on Redis (about 76 min by default, see `celery_app`). By then the
runner that sent it has long recorded a timeout, retried under a new attempt, or lost its lease
to another runner that decided the step's fate itself. Running the job then is a duplicate
side effect nobody waits for. So before a job runs, two checks:

1. Its deadline (`not_after` in the payload: when the sender stops waiting, plus a grace for
   clock skew). Celery's own `expires` carries the same instant, so an expired message is
   dropped even before this code runs.
2. Its attempt (`AttemptFence`): the step is still RUNNING at this attempt number and the
   sender still holds the task's lease. The check reads the orchestrator's database, which this
   package knows nothing about: `dayzero worker` loads it by name (DAYZERO_WORKER_FENCE,
   `module:factory`, default `orchestrator.runner.fence:from_env` when DATABASE_URL is set),
   as tool modules are loaded, so the dependency still points from orchestrator to workers.

A refused job returns a permanent `stale_attempt` outcome; a check that cannot be made (the
database is down) refuses with a retryable one: a runner still waiting retries the attempt.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from tools.base import ErrorKind

# Returns None when the job may run, else why not (and whether asking again may help).
AttemptFence = Callable[[Mapping[str, Any]], "Refusal | None"]
FENCE_ENV = "DAYZERO_WORKER_FENCE"
DEFAULT_DB_FENCE = "orchestrator.runner.fence:from_env"
CLOCK_SKEW_GRACE_S = 30.0


class Refusal:
    __slots__ = ("reason", "retryable")

    def __init__(self, reason: str, *, retryable: bool = False) -> None:
        self.reason, self.retryable = reason, retryable

    def outcome(self) -> dict[str, Any]:
        kind = ErrorKind.RETRYABLE if self.retryable else ErrorKind.PERMANENT
        return {
            "ok": False,
            "error": {"error": self.reason, "kind": kind.value, "code": "stale_attempt"},
            "duration_ms": 0.0,
        }


def not_after(timeout_s: float, now: float | None = None) -> float:
    """The `not_after` of a job sent now that the sender waits `timeout_s` for (epoch seconds)."""
    return (time.time() if now is None else now) + timeout_s + CLOCK_SKEW_GRACE_S


def check_deadline(payload: Mapping[str, Any]) -> Refusal | None:
    deadline = payload.get("not_after")
    if deadline is not None and time.time() > float(deadline):
        return Refusal("the sender stopped waiting for this attempt: not run (a late redelivery)")
    return None


_fence: AttemptFence | None = None
_fence_loaded = False
_lock = threading.Lock()


def set_process_fence(fence: AttemptFence | None) -> None:
    global _fence, _fence_loaded
    with _lock:
        _fence, _fence_loaded = fence, True


def load_fence(spec: str) -> AttemptFence:
    """`module:factory` → the fence the factory returns."""
    module, _, attr = spec.partition(":")
    if not module or not attr:
        raise ValueError(f"{FENCE_ENV} must be 'module:factory', got {spec!r}")
    return getattr(importlib.import_module(module), attr)()


def fence_spec_from_env(env: Mapping[str, str]) -> str:
    if FENCE_ENV in env:
        return env[FENCE_ENV]
    return DEFAULT_DB_FENCE if env.get("DATABASE_URL") else ""


def process_fence() -> AttemptFence | None:
    global _fence, _fence_loaded
    with _lock:
        if not _fence_loaded:
            spec = fence_spec_from_env(os.environ)
            _fence, _fence_loaded = (load_fence(spec) if spec else None), True
        return _fence


def refuse_stale(payload: Mapping[str, Any]) -> Refusal | None:
    """Both checks; None when the job may run."""
    refusal = check_deadline(payload)
    if refusal is None and (fence := process_fence()) is not None:
        refusal = fence(payload)
    return refusal

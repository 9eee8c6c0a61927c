"""The retry policy: data every package shares (a tool declares one, the runner has one for model
and preprocess attempts); the one rule that applies it is `orchestrator/retry.py`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """Per-tool retry policy, owned by the orchestrator (Celery and client retries stay off)."""

    max_attempts: int = 3
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    timeout_s: float = 30.0
    retry_on_timeout: bool = True
    # When the task should fail instead of showing the model the error after the last attempt.
    fail_task_on_exhaustion: bool = False

"""The database side of the workers' late-duplicate check (`workers.fence`).

A tool job may run only while its step is RUNNING at the job's attempt number and the runner
that sent it still holds the task's lease: otherwise its fate was already decided (a timeout
recorded, a retry under a new attempt, or another runner's resumption after a lease expiry).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Engine

from core.outage import is_outage
from orchestrator.clock import utcnow
from orchestrator.statemachine import StepStatus
from orchestrator.tasks.queries import step_state
from workers.fence import Refusal


def attempt_refusal(conn: Any, payload: Mapping[str, Any]) -> Refusal | None:
    state = step_state(conn, payload["task_id"], int(payload["step_index"]))
    if state is None:
        return Refusal("no such step: not run")
    task, status, attempt = state
    if status != StepStatus.RUNNING or attempt != int(payload["attempt"]):
        return Refusal(
            f"step is {status} at attempt {attempt}, this job is attempt {payload['attempt']}: "
            "not run (a late duplicate)"
        )
    sender = payload.get("runner_id")
    if sender is not None and (
        task.lease_owner != sender or task.lease_until is None or task.lease_until <= utcnow()
    ):
        return Refusal(
            "the runner that sent this job no longer holds the task's lease: not run (a late duplicate)"
        )
    return None


class DbAttemptFence:
    """`workers.fence.AttemptFence` reading the orchestrator's database."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def __call__(self, payload: Mapping[str, Any]) -> Refusal | None:
        try:
            with self.engine.connect() as conn:
                return attempt_refusal(conn, payload)
        except Exception as exc:
            if not is_outage(exc):
                raise
            return Refusal(f"cannot check the attempt ({type(exc).__name__}): not run", retryable=True)


def from_env() -> DbAttemptFence:
    """The fence `dayzero worker` loads (DAYZERO_WORKER_FENCE's default when DATABASE_URL is set)."""
    from orchestrator.config import Settings
    from orchestrator.db.engine import make_engine

    settings = Settings()
    kwargs = {} if settings.is_sqlite else {"pool_size": 1, "max_overflow": 2}
    return DbAttemptFence(make_engine(settings.database_url, **kwargs))

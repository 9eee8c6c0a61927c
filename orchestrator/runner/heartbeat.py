"""The lease heartbeat: renews the lease of the task the runner drives while it works on it.

One thread for the runner's life, not one per task (`runner/watcher.py`).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager

from sqlalchemy import Engine

from orchestrator.probes import Health
from orchestrator.runner.lease import LeaseLost, renew_lease
from orchestrator.runner.watcher import HeldWatcher

log = logging.getLogger(__name__)


class Heartbeat(HeldWatcher[str]):
    """Renews the held task's lease every third of its length (`with heartbeat.hold(task_id):`)."""

    def __init__(self, engine: Engine, runner_id: str, lease_s: float, health: Health):
        super().__init__("lease-heartbeat", lease_s / 3)
        self._engine, self._runner_id, self._lease_s = engine, runner_id, lease_s
        self._health = health
        self._lost: str | None = None  # a task whose lease moved on: not renewed again

    def hold(self, task_id: str) -> AbstractContextManager[str]:
        return self.holding(task_id)

    def _active(self, task_id: str) -> bool:
        return task_id != self._lost

    def _tick(self, task_id: str) -> None:
        try:
            with self._engine.begin() as conn:
                renew_lease(conn, task_id, self._runner_id, self._lease_s)
            self._health.beat()
        except LeaseLost:
            with self._cond:
                self._lost = task_id
        except Exception:  # a DB blip: the next beat or the step's own commit will tell
            log.warning("lease renewal failed for %s", task_id, exc_info=True)

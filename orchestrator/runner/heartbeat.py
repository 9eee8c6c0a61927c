"""The lease heartbeat: renews the task's lease while a step executes."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

from orchestrator.probes import Health
from orchestrator.runner.lease import LeaseLost, renew_lease

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews the lease every third of its length while a step executes."""

    def __init__(self, engine: Engine, task_id: str, runner_id: str, lease_s: float, health: Health):
        self._args = (engine, task_id, runner_id, lease_s)
        self._health = health
        self._stop = threading.Event()
        self.lost = False
        self._thread = threading.Thread(target=self._run, name=f"lease-{task_id[:8]}", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        engine, task_id, runner_id, lease_s = self._args
        while not self._stop.wait(lease_s / 3):
            try:
                with engine.begin() as conn:
                    renew_lease(conn, task_id, runner_id, lease_s)
                self._health.beat()
            except LeaseLost:
                self.lost = True
                return
            except Exception:  # a DB blip: the next beat or the step's own commit will tell
                log.warning("lease renewal failed for %s", task_id, exc_info=True)

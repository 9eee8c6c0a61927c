"""The lease heartbeat: renews the lease of the task the runner drives while it works on it.

One thread for the runner's life, not one per task: starting (and joining) a thread per task
cost milliseconds of every task's start on a busy host (benchmarks/orchestrator_overhead.py).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine

from orchestrator.probes import Health
from orchestrator.runner.lease import LeaseLost, renew_lease

log = logging.getLogger(__name__)


class Heartbeat:
    """Renews the held task's lease every third of its length (`with heartbeat.hold(task_id):`)."""

    def __init__(self, engine: Engine, runner_id: str, lease_s: float, health: Health):
        self._engine, self._runner_id, self._lease_s = engine, runner_id, lease_s
        self._health = health
        self._cond = threading.Condition()
        self._task: str | None = None
        self._since = 0.0  # when the held task's lease was last taken or renewed
        self._lost: str | None = None  # a task whose lease moved on: not renewed again
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def hold(self, task_id: str) -> Iterator[None]:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)
                self._thread.start()
            self._task, self._since = task_id, time.monotonic()
            self._cond.notify()
        try:
            yield
        finally:
            with self._cond:
                self._task = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        period = self._lease_s / 3
        with self._cond:
            while not self._closed:
                task = self._task
                if task is None or task == self._lost:
                    self._cond.wait()
                    continue
                wait = self._since + period - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                self._since = time.monotonic()
                self._cond.release()  # the renewal's round trip does not block hold()/release
                try:
                    self._renew(task)
                finally:
                    self._cond.acquire()

    def _renew(self, task_id: str) -> None:
        try:
            with self._engine.begin() as conn:
                renew_lease(conn, task_id, self._runner_id, self._lease_s)
            self._health.beat()
        except LeaseLost:
            with self._cond:
                self._lost = task_id
        except Exception:  # a DB blip: the next beat or the step's own commit will tell
            log.warning("lease renewal failed for %s", task_id, exc_info=True)

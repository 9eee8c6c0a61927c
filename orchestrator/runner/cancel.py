"""Cancellation while a step is in flight.

A cancel request only sets the task's `cancel_requested` flag while a runner holds the task. The
runner's step boundary honours it; a step that is still running (a model call, a tool job) is
interrupted by this watch: while a step runs, one thread per runner reads the flag every
`poll_s`, and on a cancel sets the step's `CancelSignal` and runs the aborts the step registered
(closing the model request's connection, which frees the server's slot; the dispatchers stop
waiting for a tool job and revoke it). The step then writes nothing, and the runner ends the
task CANCELLED at once (its open step abandoned, a late result ignored).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

from sqlalchemy import Engine, select

from orchestrator.db.tables import tasks_t
from orchestrator.runner.watcher import HeldWatcher

log = logging.getLogger(__name__)


class CancelSignal:
    """The cancel state of the step in flight: `event` is set once the task was cancelled."""

    def __init__(self, engine: Engine, task_id: str):
        self.engine, self.task_id = engine, task_id
        self.event = threading.Event()
        self._aborts: list[Callable[[], None]] = []
        self._lock = threading.Lock()

    def add_abort(self, abort: Callable[[], None]) -> None:
        """Run `abort` when the task is cancelled (at once if it already was)."""
        with self._lock:
            self._aborts.append(abort)
            fired = self.event.is_set()
        if fired:
            abort()

    def fire(self) -> None:
        with self._lock:
            if self.event.is_set():
                return
            self.event.set()
            aborts = list(self._aborts)
        for abort in aborts:
            with suppress(Exception):  # best effort: the step stops waiting either way
                abort()

    def requested(self) -> bool:
        """Read the flag now (before a step commits the task's end: a cancel answered 202 a
        moment ago must not turn into SUCCEEDED)."""
        if self.event.is_set():
            return True
        with self.engine.connect() as conn:
            flag = conn.execute(
                select(tasks_t.c.cancel_requested).where(tasks_t.c.id == self.task_id)
            ).scalar_one_or_none()
        if flag:
            self.fire()
        return bool(flag)


class CancelWatch(HeldWatcher[CancelSignal]):
    """One thread per runner that polls the cancel flag of the task whose step is in flight."""

    def __init__(self, engine: Engine, poll_s: float = 0.25):
        super().__init__("cancel-watch", poll_s)
        self._engine = engine

    @contextmanager
    def watch(self, task_id: str) -> Iterator[CancelSignal]:
        with self.holding(CancelSignal(self._engine, task_id)) as signal:
            yield signal

    def _active(self, signal: CancelSignal) -> bool:
        return not signal.event.is_set()

    def _tick(self, signal: CancelSignal) -> None:
        try:
            signal.requested()
        except Exception:  # a DB blip: the next poll or the step's boundary will tell
            log.debug("cancel check failed for %s", signal.task_id, exc_info=True)

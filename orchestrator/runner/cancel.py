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


class CancelWatch:
    """One thread per runner that polls the cancel flag of the task whose step is in flight."""

    def __init__(self, engine: Engine, poll_s: float = 0.25):
        self._engine, self._poll_s = engine, poll_s
        self._cond = threading.Condition()
        self._signal: CancelSignal | None = None
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def watch(self, task_id: str) -> Iterator[CancelSignal]:
        signal = CancelSignal(self._engine, task_id)
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._run, name="cancel-watch", daemon=True)
                self._thread.start()
            self._signal = signal
            self._cond.notify()
        try:
            yield signal
        finally:
            with self._cond:
                self._signal = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                signal = self._signal
                if signal is None or signal.event.is_set():
                    self._cond.wait()
                    continue
                # A step shorter than one period is never polled: the boundary check covers it.
                self._cond.wait(self._poll_s)
                if self._signal is not signal or self._closed:
                    continue
                self._cond.release()  # the read's round trip does not block watch()
                try:
                    signal.requested()
                except Exception:  # a DB blip: the next poll or the step's boundary will tell
                    log.debug("cancel check failed for %s", signal.task_id, exc_info=True)
                finally:
                    self._cond.acquire()

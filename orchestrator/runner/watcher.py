"""One thread for the runner's life that acts, every period, on what the runner holds now.

The lease heartbeat (renew the held task's lease) and the cancel watch (read the cancel flag of
the step in flight) are both this: starting and joining a thread per task cost milliseconds of
every task's start on a busy host, so each keeps one daemon thread that sleeps while nothing is
held and wakes at once when the held item changes or the watcher closes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Generic, TypeVar

T = TypeVar("T")


class HeldWatcher(Generic[T]):
    """Calls `_tick(item)` every `period_s` while `item` is held and `_active(item)`; the first
    call comes one period after it was taken (a hold shorter than a period is never ticked)."""

    def __init__(self, name: str, period_s: float) -> None:
        self._name, self._period_s = name, period_s
        self._cond = threading.Condition()
        self._item: T | None = None
        self._since = 0.0  # when the held item was taken or last ticked
        self._closed = False
        self._thread: threading.Thread | None = None

    @contextmanager
    def holding(self, item: T) -> Iterator[T]:
        with self._cond:
            if self._thread is None or not self._thread.is_alive():
                self._closed = False
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._item, self._since = item, time.monotonic()
            self._cond.notify()
        try:
            yield item
        finally:
            with self._cond:
                self._item = None
                self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _active(self, item: T) -> bool:
        """Whether `item` still needs ticks (the held item may have settled before its release)."""
        return True

    def _tick(self, item: T) -> None:
        """The periodic action; runs without the lock, so holding and releasing never wait on it."""
        raise NotImplementedError

    def _run(self) -> None:
        with self._cond:
            while not self._closed:
                item = self._item
                if item is None or not self._active(item):
                    self._cond.wait()
                    continue
                wait = self._since + self._period_s - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                self._since = time.monotonic()
                self._cond.release()
                try:
                    self._tick(item)
                finally:
                    self._cond.acquire()

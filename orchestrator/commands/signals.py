"""SIGTERM/SIGINT for the long-running commands: a stop asked during start-up is never lost.

A command first routes the signals to an `Event` (start-up code waits on it), then, once its
loop exists, to the loop's `stop()`. A signal that landed between the two (while the loop was
being built) would otherwise be dropped and the process would run on after it was told to stop.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable

log = logging.getLogger("dayzero")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def _logged(stop: Callable[[], None]) -> Callable[[int, object], None]:
    def handler(signum: int, _frame: object) -> None:
        log.info("%s received: stopping", signal.Signals(signum).name)
        stop()

    return handler


def stop_on_signals() -> threading.Event:
    """An event that SIGTERM/SIGINT set (the start-up phase)."""
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, _logged(stop.set))
    return stop


def hand_over(early: threading.Event, stop: Callable[[], None]) -> None:
    """Route SIGTERM/SIGINT to `stop` from now on; if one already came (`early` is set), call it now.

    The handlers are replaced before `early` is read, so a signal lands in one of the two."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, _logged(stop))
    if early.is_set():
        stop()

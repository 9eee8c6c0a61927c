"""Outages: which errors mean "a dependency is down or restarting", and the one loop that waits
them out.

An outage (the database, the Kafka broker, the Celery broker or result backend, the model
server) is waited out with backoff and reported as unreadiness; it never fails a task and
never ends a process. Every other error is about the work itself (a record the database
refuses, a bug) and must be handled as such: retrying it would wait forever on something that
can never succeed (one bad record used to stop a whole partition's ingest that way).

Only error classes of libraries already imported are checked: an exception cannot be an
instance of a class that was never loaded, and this module must not pull in the database
driver, the Kafka client or Celery for a process that uses none of them.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable
from typing import Protocol, TypeVar

from core.backoff import Backoff

T = TypeVar("T")
log = logging.getLogger(__name__)

# SQLSTATE classes of a server that is unreachable, shutting down, out of resources or that
# aborted the transaction for a reason of its own (deadlock, serialization): try again later.
_OUTAGE_SQLSTATE_CLASSES = ("08", "40", "53", "57", "58")


class DependencyUnavailable(ConnectionError):
    """A service this process needs (named in the message) is down or restarting. Wait and retry;
    the work itself is fine."""


class OutageOutlasted(TimeoutError):
    """A dependency stayed down past the caller's deadline. The work was not done; the caller
    decides what the deadline means for it (a task that times out, a job not sent)."""

    def __init__(self, what: str, last: BaseException) -> None:
        super().__init__(f"{what}: still unavailable at the deadline ({type(last).__name__}: {last})")
        self.last = last


class Stopped(Exception):
    """The process was asked to stop while it waited out an outage."""


def _loaded(module: str, *names: str) -> tuple[type[BaseException], ...]:
    mod = sys.modules.get(module)
    return tuple(getattr(mod, n) for n in names if mod is not None and hasattr(mod, n))


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says a dependency is unavailable (wait it out) rather than that the work is
    wrong (a data error, a constraint, a bug: handle or fail it, never wait for it)."""
    dbapi = _loaded("sqlalchemy.exc", "DBAPIError")
    if dbapi and isinstance(exc, dbapi):
        # Before the builtins: a driver's error may subclass ConnectionError for a refused query.
        if isinstance(exc, _loaded("sqlalchemy.exc", "OperationalError", "InterfaceError")):
            return True
        if getattr(exc, "connection_invalidated", False):
            return True
        state = getattr(getattr(exc, "orig", None), "sqlstate", None) or ""
        return state[:2] in _OUTAGE_SQLSTATE_CLASSES
    if isinstance(exc, ConnectionError | TimeoutError):  # DependencyUnavailable, sockets, pools
        return True
    outage_types = (
        *_loaded("sqlalchemy.exc", "DisconnectionError", "TimeoutError"),
        *_loaded("kafka.errors", "KafkaError"),
        *_loaded("kombu.exceptions", "OperationalError"),
        *_loaded("redis.exceptions", "ConnectionError", "TimeoutError", "BusyLoadingError"),
        *_loaded("httpx", "TransportError"),
    )
    return bool(outage_types) and isinstance(exc, outage_types)


class Readiness(Protocol):
    """What a wait-out reports to (the probes' `Health`)."""

    def set_ready(self) -> None: ...

    def set_unready(self, reason: str) -> None: ...


def wait_out(
    what: str,
    fn: Callable[[], T],
    *,
    stop: threading.Event | None = None,
    readiness: Readiness | None = None,
    backoff: Backoff | None = None,
    deadline: float | None = None,
    classify: Callable[[BaseException], bool] = is_outage,
) -> T:
    """`fn()` until it returns, waiting out outages with backoff (other errors propagate).

    `readiness` is told unready while the outage lasts and ready once `fn` succeeds; `backoff`
    may be kept by a loop that calls this once per turn, so that consecutive outages back off
    further. `deadline` (`time.monotonic()`) bounds the wait: `OutageOutlasted` then. `stop`
    being set ends the wait with `Stopped`."""
    backoff = backoff if backoff is not None else Backoff()
    while True:
        try:
            result = fn()
        except BaseException as exc:
            if not classify(exc):
                raise
            delay = backoff.next_delay()
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise OutageOutlasted(what, exc) from exc
                delay = min(delay, left)
            if readiness is not None:
                readiness.set_unready(f"{what}: {type(exc).__name__}")
            log.warning("%s: %s (%s); retrying in %.1f s", what, type(exc).__name__, exc, delay)
            if stop is not None:
                if stop.wait(delay):
                    raise Stopped(what) from exc
            else:
                time.sleep(delay)
            continue
        if backoff.failures:
            log.info("%s: available again after %d failed tries", what, backoff.failures)
        backoff.reset()
        if readiness is not None:
            readiness.set_ready()
        return result

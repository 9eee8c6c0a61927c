"""The live event feed of the SSE endpoint (`GET /v1/tasks/{id}/events`).

The endpoint re-reads the `events` table (the source of truth) and sleeps between reads on a
`Subscription`: on PostgreSQL woken by `LISTEN dayzero_events` (the trigger in migration 0002
NOTIFYs the task id on commit), elsewhere — and as a safety net — by polling.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from sqlalchemy import Engine

from orchestrator.events import NOTIFY_CHANNEL

log = logging.getLogger(__name__)


# -- live feed -------------------------------------------------------------------------------------


class Subscription:
    """Wakes an SSE stream when its task may have new events. Clear, read, then `wait`."""

    def __init__(self, feed: EventFeed, task_id: str):
        self.feed, self.task_id = feed, task_id
        self.event = asyncio.Event()

    def clear(self) -> None:
        self.event.clear()

    async def wait(self, timeout_s: float) -> None:
        with suppress(TimeoutError):
            await asyncio.wait_for(self.event.wait(), timeout=min(timeout_s, self.feed.poll_s))


class EventFeed:
    """Polling feed (every `poll_s`); the base of the NOTIFY feed."""

    def __init__(self, poll_s: float = 0.5):
        self.poll_s = poll_s
        self._subs: dict[str, set[Subscription]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()

    def stop(self) -> None:
        pass

    @contextmanager
    def subscribe(self, task_id: str) -> Iterator[Subscription]:
        sub = Subscription(self, task_id)
        self._subs.setdefault(task_id, set()).add(sub)
        try:
            yield sub
        finally:
            subs = self._subs.get(task_id)
            if subs is not None:
                subs.discard(sub)
                if not subs:
                    self._subs.pop(task_id, None)

    def _wake(self, task_id: str) -> None:  # on the event loop
        for sub in list(self._subs.get(task_id, ())):
            sub.event.set()


class PgNotifyFeed(EventFeed):
    """LISTEN on a dedicated psycopg connection in a thread; polling stays on as a safety net."""

    def __init__(self, database_url: str, poll_s: float = 2.0):
        super().__init__(poll_s)
        self.url = database_url
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.connected = threading.Event()

    def start(self) -> None:
        super().start()
        self._thread = threading.Thread(target=self._listen, name="pg-listen", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _listen(self) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        u = make_url(self.url)
        dsn = u.set(drivername="postgresql").render_as_string(hide_password=False)
        while not self._stop.is_set():
            try:
                with psycopg.connect(dsn, autocommit=True) as conn:
                    conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
                    self.connected.set()
                    while not self._stop.is_set():
                        for n in conn.notifies(timeout=0.5):
                            if self._loop is not None:
                                self._loop.call_soon_threadsafe(self._wake, n.payload)
            except Exception as exc:  # reconnect; polling covers the gap
                self.connected.clear()
                log.warning("LISTEN connection lost (%s); reconnecting", exc)
                self._stop.wait(1.0)


def make_feed(engine: Engine, poll_s: float, listen: bool = True) -> EventFeed:
    if listen and engine.dialect.name == "postgresql":
        return PgNotifyFeed(engine.url.render_as_string(hide_password=False), poll_s=max(poll_s, 2.0))
    return EventFeed(poll_s)

"""The outbox relay: the `events` table (the transactional outbox) to Kafka.

Relay. Reads the events past its cursor in id order, publishes each to `dayzero.events` (key =
task id, so one task's events share a partition and keep their order) and, for terminal task
events, the task's outcome to `dayzero.results`; waits for the broker's acks, then moves its
cursor (`relay_cursors`: one small row; nothing is written back to the events, whose update
cost more WAL than the relay's whole job otherwise). Ids become visible in commit order, not in
id order: `outbox_cursor` says when an id skipped over can no longer appear. A relay killed
between the ack and the cursor's move republishes from its last saved mark on restart:
delivery is at-least-once, and `(task_id, seq)` is the consumer's dedupe key. Per-task order
holds because a task's events are written under its row lock (ids grow with seq, and a later
event of a task is visible only once its earlier ones are) and the producer has one request in
flight: a crash only replays a suffix of what was sent (a consumer skipping seqs it has seen
reads an exact, gap-free sequence). One caveat: if a send fails for good (retries exhausted)
while later sends of the same round succeed, a consumer can see a gap before the retried round
fills it; `seq` then restores the order. On PostgreSQL one relay is active at a time (an
advisory lock); others wait as hot standbys and take the cursor over from the table.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from sqlalchemy import Connection, Engine, func, insert, select, text, update
from sqlalchemy.exc import SQLAlchemyError

from core.backoff import Backoff
from core.outage import Stopped, is_outage, wait_out
from orchestrator.clock import utcnow
from orchestrator.db.tables import events_t, relay_cursors_t, tasks_t
from orchestrator.events import TERMINAL_EVENT_TYPES, event_record
from orchestrator.failpoints import failpoint
from orchestrator.kafka.outbox_cursor import OutboxCursor
from orchestrator.kafka.renewal import Renewable
from orchestrator.metrics import RELAY_LAG, RELAY_PUBLISHED
from orchestrator.probes import Health
from orchestrator.tasks.queries import read_events_past
from orchestrator.tracing import context_of, kafka_headers, tracer

log = logging.getLogger(__name__)

EVENTS_TOPIC = "dayzero.events"
RESULTS_TOPIC = "dayzero.results"
RELAY_LOCK_ID = 0x64617930  # pg advisory lock key of the active relay
CURSOR_NAME = "default"  # the `relay_cursors` row of the (one active) relay


# -- relay ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RelayConfig:
    events_topic: str = EVENTS_TOPIC
    results_topic: str = RESULTS_TOPIC
    batch_size: int = 500
    idle_sleep_s: float = 0.1


class Relay:
    """Publishes the outbox to Kafka. `producer` is a kafka-python `KafkaProducer` (or look-alike)."""

    def __init__(
        self,
        engine: Engine,
        producer: Any,
        config: RelayConfig | None = None,
        *,
        health: Health | None = None,
        producer_factory: Callable[[], Any] | None = None,
    ):
        self.engine = engine
        # Replaced after a broker error (`renewal`): a restarted broker can leave it unusable.
        self._producer = Renewable(producer, producer_factory, "relay producer")
        self.config = config or RelayConfig()
        self.health = health or Health()
        self.outages = 0
        self._stop = threading.Event()
        self._cursor: OutboxCursor | None = None  # read from the table when (re)activated
        self._saved_low_water: int | None = None

    @property
    def producer(self) -> Any:
        return self._producer.current

    @producer.setter
    def producer(self, producer: Any) -> None:
        self._producer.current = producer

    def stop(self) -> None:
        self._stop.set()

    def run_forever(self) -> None:
        """Publish until `stop()`. A database or broker outage is waited out with backoff: the
        unacked round is simply published again (at-least-once), and the active-relay lock is
        taken anew, since a lost connection released it and a standby may hold it now. After a
        broker error the producer is replaced (`producer_factory`) before the next round."""
        self._backoff = Backoff()
        try:
            wait_out(
                "relay",
                self._run_active,
                stop=self._stop,
                readiness=self.health,
                backoff=self._backoff,
                classify=self._on_error,
            )
        except Stopped:
            return

    def _run_active(self) -> None:
        self._producer.renew_if_suspect()
        with self._active_lock() as still_active:
            while not self._stop.is_set():
                still_active()
                n = self.publish_batch()
                self._backoff.reset()
                self.health.set_ready()
                if n == 0:
                    self._stop.wait(self.config.idle_sleep_s)

    def _on_error(self, exc: BaseException) -> bool:
        outage = is_outage(exc)
        if outage:
            self.outages += 1
            self._producer.note(exc)
        return outage

    def run_until_drained(self, timeout_s: float = 30.0) -> int:
        total, end = 0, time.monotonic() + timeout_s
        while time.monotonic() < end:
            n = self.publish_batch()
            if n == 0:
                return total
            total += n
        raise TimeoutError("outbox not drained")

    @contextmanager
    def _active_lock(self) -> Iterator[Callable[[], None]]:
        """Hold the active-relay lock; yields a check that raises if the lock's connection died."""
        self._cursor = None  # whoever was active before may have moved it
        if self.engine.dialect.name != "postgresql":
            yield lambda: None
            return
        with self.engine.connect() as conn:
            while not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": RELAY_LOCK_ID}).scalar():
                conn.rollback()
                self.health.set_ready()  # a hot standby is ready: it is doing its job
                if self._stop.wait(1.0):
                    yield lambda: None
                    return
            conn.commit()
            log.info("relay active")

            def still_active() -> None:
                conn.execute(text("SELECT 1"))  # the lock lives as long as this session
                conn.commit()

            try:
                yield still_active
            finally:
                # Best effort: if the session died (the outage that brought us here), the lock
                # went with it, and the connection may refuse even a rollback.
                with suppress(SQLAlchemyError):
                    conn.rollback()
                    conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": RELAY_LOCK_ID})
                    conn.commit()

    def publish_batch(self) -> int:
        """Publish up to `batch_size` events past the cursor, and any skipped over before that
        have appeared since; returns how many rows it moved past (0: nothing new)."""
        if self._cursor is None:
            with self.engine.connect() as conn:
                self._saved_low_water = low_water(conn)
            self._cursor = OutboxCursor.starting_at(self._saved_low_water)
        cursor = self._cursor
        with self.engine.connect() as conn:
            new, late, xmin, xmax = read_events_past(conn, cursor, _EVENT_ROW, self.config.batch_size)
        read = late + new  # in id order: the holes lie below the frontier, the new rows above it
        # Rows migrated from the old step and message tables carry no event (migration 0011):
        # the cursor passes them, nothing is sent.
        rows = [r for r in read if r.type is not None]
        if rows:
            self._publish(rows)
        cursor.advance([r.id for r in new], [r.id for r in late], xmin, xmax)
        if cursor.low_water != self._saved_low_water:
            with self.engine.begin() as conn:
                save_low_water(conn, cursor.low_water)
            self._saved_low_water = cursor.low_water
        RELAY_LAG.set(len(rows))
        return len(read)

    def _publish(self, rows: list[Any]) -> None:
        """Send `rows` in order and wait for every ack (raises if any send failed)."""
        cfg = self.config
        futures = []
        for r in rows:
            headers = [("dayzero-event-type", r.type.encode()), ("dayzero-seq", str(r.seq).encode())]
            # A producer span per event, in the task's trace; its context rides in the headers.
            span = tracer.start_span(
                f"{cfg.events_topic} publish",
                context=context_of(r.traceparent),
                kind=SpanKind.PRODUCER,
                attributes={
                    "messaging.system": "kafka",
                    "messaging.operation.type": "publish",
                    "messaging.destination.name": cfg.events_topic,
                    "dayzero.task_id": r.task_id,
                    "dayzero.event_type": r.type,
                    "dayzero.seq": r.seq,
                },
            )
            with trace.use_span(span, end_on_exit=True):
                headers += kafka_headers(r.traceparent)
            value = event_record(r.task_id, r.seq, r.type, r.payload, r.created_at, r.tenant)
            futures.append(
                self.producer.send(
                    cfg.events_topic,
                    key=r.task_id.encode(),
                    value=json.dumps(value, default=str).encode(),
                    headers=headers,
                )
            )
            if r.type in TERMINAL_EVENT_TYPES:
                futures.append(
                    self.producer.send(
                        cfg.results_topic,
                        key=r.task_id.encode(),
                        value=json.dumps(result_record(r), default=str).encode(),
                        headers=headers,
                    )
                )
        self.producer.flush()
        for f in futures:
            f.get(timeout=30)  # raises if any send failed: the cursor stays, all is retried
        failpoint("relay.after_publish")
        n_results = sum(1 for r in rows if r.type in TERMINAL_EVENT_TYPES)
        RELAY_PUBLISHED.labels(cfg.events_topic).inc(len(rows))
        if n_results:
            RELAY_PUBLISHED.labels(cfg.results_topic).inc(n_results)


# -- the outbox past the cursor ------------------------------------------------------------------
_EVENT_ROW = (
    select(
        events_t.c.id,
        events_t.c.task_id,
        events_t.c.seq,
        events_t.c.type,
        events_t.c.payload,
        events_t.c.created_at,
        tasks_t.c.tenant,
        tasks_t.c.status,
        tasks_t.c.result,
        tasks_t.c.error,
        tasks_t.c.step_count,
        tasks_t.c.prompt_tokens,
        tasks_t.c.cached_tokens,
        tasks_t.c.completion_tokens,
        tasks_t.c.finished_at,
        tasks_t.c.traceparent,
        tasks_t.c.metadata,
    )
    .select_from(events_t.outerjoin(tasks_t, tasks_t.c.id == events_t.c.task_id))
    .order_by(events_t.c.id)
)


def low_water(conn: Connection) -> int:
    """The relay's saved mark: every event with a smaller id has been published."""
    mark = conn.execute(
        select(relay_cursors_t.c.low_water).where(relay_cursors_t.c.name == CURSOR_NAME)
    ).scalar_one_or_none()
    return 0 if mark is None else mark


def save_low_water(conn: Connection, mark: int) -> None:
    hit = conn.execute(
        update(relay_cursors_t)
        .where(relay_cursors_t.c.name == CURSOR_NAME)
        .values(low_water=mark, updated_at=utcnow())
    ).rowcount
    if not hit:
        conn.execute(insert(relay_cursors_t).values(name=CURSOR_NAME, low_water=mark, updated_at=utcnow()))


def unpublished_count(conn: Connection) -> int:
    """Events at or above the saved mark: what a relay starting now would (re)publish."""
    return conn.execute(
        select(func.count())
        .select_from(events_t)
        .where(events_t.c.id >= low_water(conn), events_t.c.type.is_not(None))
    ).scalar_one()


def result_record(r: Any) -> dict[str, Any]:
    status = r.type.removeprefix("task.").upper()
    return {
        "task_id": r.task_id,
        "tenant": r.tenant,
        "status": status,
        "result": r.result if status == "SUCCEEDED" else None,
        "error": r.error,
        "usage": {
            "steps": r.step_count,
            "prompt_tokens": r.prompt_tokens,
            "cached_tokens": r.cached_tokens,
            "completion_tokens": r.completion_tokens,
        },
        "metadata": r.metadata,
        "finished_at": r.finished_at.isoformat() if r.finished_at else None,
        "seq": r.seq,
    }


def make_relay_producer(bootstrap: str, **overrides: Any) -> Any:
    from kafka import KafkaProducer

    cfg: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "linger_ms": 5,
        "retries": 5,
        "max_in_flight_requests_per_connection": 1,  # retries never reorder a task's events
        # A broker that is away shows within 20 s (the default, 120 s, kept the relay in one
        # flush, saying nothing, through a whole restart); the round is then sent again.
        "request_timeout_ms": 10_000,
        "delivery_timeout_ms": 20_000,
        "client_id": "dayzero-relay",
    }
    cfg.update(overrides)
    return KafkaProducer(**cfg)

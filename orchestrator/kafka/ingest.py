"""Kafka ingest: `dayzero.tasks` → task rows, exactly once per (tenant, idempotency key).

Per poll: validate every record (the REST body schema plus `tenant`; key = idempotency key),
create the valid ones in ONE DB transaction (`tasks.create.create_tasks`), commit it, send the invalid
ones to the DLQ with the reason in headers and wait for the broker's ack, and only then commit the
offsets. A crash anywhere before the offset commit redelivers the batch; the idempotent insert
turns the redelivery into no-ops (a DLQ record may then appear twice). Records without a key get
a derived one, `kafka:<topic>:<partition>:<offset>:<timestamp>:<topic id>`, so they too are
created once (a re-created topic's record never takes an old one's key). A topic deleted and
re-created under the consumer restarts from its beginning (`incarnation`).

Back-pressure: while `max_pending` or more tasks are PENDING/READY the consumer pauses all its
partitions (it keeps polling, so it stays in the group) and resumes below `resume_fraction` of it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from opentelemetry.trace import SpanKind
from pydantic import ValidationError
from sqlalchemy import Engine, func, select
from sqlalchemy.exc import DBAPIError, IntegrityError

from core import jsonlimits
from core.backoff import Backoff
from core.outage import Stopped, is_outage, wait_out
from orchestrator.auth import known_tenants
from orchestrator.config import KafkaSettings, Settings
from orchestrator.db.tables import tasks_t
from orchestrator.failpoints import failpoint
from orchestrator.kafka.incarnation import TopicIncarnations
from orchestrator.kafka.renewal import Renewable
from orchestrator.metrics import INGEST_BATCH_SECONDS, INGEST_MESSAGES, INGEST_PAUSED, TASKS_SUBMITTED
from orchestrator.probes import Health
from orchestrator.statemachine import TaskStatus
from orchestrator.tasks.create import NewTask, create_tasks
from orchestrator.tasks.errors import IdempotencyConflict
from orchestrator.tasks.schemas import KafkaTaskMessage
from orchestrator.tasks.submission import InvalidSubmission, check_allowed_tools, submit_task, to_new_task
from orchestrator.tracing import context_of, trace_error, tracer, valid_traceparent

log = logging.getLogger(__name__)

MAX_KEY_CHARS = 255


@dataclass(frozen=True, slots=True)
class Rejected:
    record: Any
    # machine-readable: oversize, bad_json, too_deep, schema, tenant_not_allowed, unknown_tenant,
    # bad_key, idempotency_conflict, invalid_number, invalid_data, invalid, …
    reason: str
    detail: str


@dataclass(frozen=True, slots=True)
class Accepted:
    record: Any
    message: KafkaTaskMessage
    key: str
    traceparent: str | None


def _header(record: Any, name: str) -> bytes | None:
    for k, v in record.headers or ():
        if k == name:
            return v
    return None


class TenantDirectory:
    """Known tenants (those holding an API key), refreshed every `ttl_s` and at most once a second on a miss."""

    def __init__(self, engine: Engine, ttl_s: float = 5.0):
        self.engine, self.ttl_s = engine, ttl_s
        self._tenants: set[str] = set()
        self._loaded_at = float("-inf")

    def _load(self) -> None:
        with self.engine.connect() as conn:
            self._tenants = known_tenants(conn)
        self._loaded_at = time.monotonic()

    def __contains__(self, tenant: str) -> bool:
        age = time.monotonic() - self._loaded_at
        if age > self.ttl_s or (tenant not in self._tenants and age > 1.0):
            self._load()
        return tenant in self._tenants


class Ingestor:
    def __init__(
        self,
        engine: Engine,
        consumer: Any,
        producer: Any,
        settings: Settings,
        kafka: KafkaSettings,
        *,
        max_message_bytes: int,
        health: Health | None = None,
        producer_factory: Callable[[], Any] | None = None,
    ):
        self.engine = engine
        self.consumer = consumer
        # The dead-letter producer, replaced after a broker error (`renewal`).
        self._producer = Renewable(producer, producer_factory, "dead-letter producer")
        self.settings = settings
        self.kafka = kafka
        self.max_message_bytes = max_message_bytes
        self.tenants = TenantDirectory(engine)
        self.incarnations = TopicIncarnations(consumer)
        self.known_tools = settings.known_tools()
        self.paused = False
        self._pending_checked = float("-inf")
        self._pending = 0  # last count + tasks created here since
        self._stop = threading.Event()
        self._unfinished: list[Any] | None = None  # a polled batch whose offsets are not committed yet
        self.health = health or Health()
        self.stats = {"created": 0, "duplicate": 0, "dlq": 0, "batches": 0, "outages": 0}
        self._spans: dict[int, Any] = {}  # id(record) -> its consumer span, during `handle`

    # -- loop ----------------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    def run_forever(self, until: Callable[[], bool] | None = None) -> None:
        """Loop until `stop()`. A database or broker outage is waited out with backoff (readiness
        reports it); the batch in hand is retried as it is, so nothing is skipped. An error of
        one record (data the database refuses) is never an outage: that record is dead-lettered."""
        backoff = Backoff()
        while not self._stop.is_set() and not (until is not None and until()):
            try:
                wait_out(
                    "ingest",
                    self.run_once,
                    stop=self._stop,
                    readiness=self.health,
                    backoff=backoff,
                    classify=self._is_outage,
                )
            except Stopped:
                return

    def _is_outage(self, exc: BaseException) -> bool:
        outage = is_outage(exc)
        self.stats["outages"] += outage
        if outage:
            self._producer.note(exc)
        return outage

    @property
    def producer(self) -> Any:
        return self._producer.current

    def run_once(self) -> int:
        """One poll → one DB transaction → one offset commit. Returns the records handled.

        If this raises, the batch stays in hand and the next call handles it again (the inserts
        are idempotent): polling on would move past records whose offsets were never committed."""
        records = self._unfinished
        if records is None:
            self._apply_back_pressure()
            polled = self.consumer.poll(
                timeout_ms=self.kafka.poll_timeout_ms, max_records=self.kafka.batch_max
            )
            records = self.incarnations.check([r for batch in polled.values() for r in batch])
            if not records:
                return 0
            self._unfinished = records
        self.handle(records)
        failpoint("ingest.after_db_commit")
        self._commit_offsets(records)
        self._unfinished = None
        return len(records)

    # -- one batch ------------------------------------------------------------------------------
    def parse(self, record: Any) -> Accepted | Rejected:
        """Validate one record. Never raises: a record that would crash ingest would crash it again
        after every restart (its offset is never committed), so anything unforeseen is a DLQ reason."""
        try:
            return self._parse(record)
        except Exception as exc:
            log.exception(
                "unexpected error validating %s:%s@%s", record.topic, record.partition, record.offset
            )
            return Rejected(record, "invalid", f"{type(exc).__name__}: {exc}"[:1000])

    def _parse(self, record: Any) -> Accepted | Rejected:
        value = record.value
        if value is None:
            return Rejected(record, "bad_json", "empty message value")
        if len(value) > self.max_message_bytes:
            return Rejected(record, "oversize", f"{len(value)} bytes > limit {self.max_message_bytes}")
        try:
            data = jsonlimits.loads(value, self.settings.ingress.max_json_depth)
        except jsonlimits.JSONTooDeep as exc:
            return Rejected(record, "too_deep", str(exc))
        except ValueError as exc:  # includes UnicodeDecodeError
            return Rejected(record, "bad_json", str(exc)[:500])
        try:
            msg = KafkaTaskMessage.model_validate(data)
        except ValidationError as exc:
            errors = exc.errors(include_input=False)
            errs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in errors[:5])
            reason = "invalid_number" if any(e["type"] == "invalid_number" for e in errors) else "schema"
            return Rejected(record, reason, errs[:1000])
        if record.key is None:
            # The topic's id and the record's timestamp too: a re-created topic starts its offsets
            # again at 0, and `topic:partition:offset` alone would name an old task.
            key = f"kafka:{record.topic}:{record.partition}:{record.offset}:{record.timestamp}"
            if (topic_id := self.incarnations.id_of(record.topic)) is not None:
                key += f":{topic_id}"
        else:
            try:
                key = record.key.decode("utf-8")
            except UnicodeDecodeError:
                return Rejected(record, "bad_key", "key is not UTF-8")
            if not key or len(key) > MAX_KEY_CHARS:
                return Rejected(record, "bad_key", f"key must be 1..{MAX_KEY_CHARS} characters")
        allowed = self.kafka.allowed_tenants
        if allowed is not None and msg.tenant not in allowed:
            return Rejected(
                record, "tenant_not_allowed", f"this ingest may not create tasks for {msg.tenant!r}"
            )
        if msg.tenant not in self.tenants:
            return Rejected(record, "unknown_tenant", f"tenant {msg.tenant!r} has no API key")
        try:
            check_allowed_tools(msg, self.known_tools)
        except InvalidSubmission as exc:
            return Rejected(record, exc.reason, exc.detail)
        tp = _header(record, "traceparent")
        tp_s = tp.decode("ascii", "replace") if tp else None
        return Accepted(record, msg, key, valid_traceparent(tp_s))

    def handle(self, records: list[Any]) -> None:
        parsed = [self.parse(r) for r in records]
        # One consumer span per accepted record, a child of the producer's context (its header);
        # the task's trace context is this span, so everything the task does hangs below it.
        self._spans = {}
        parsed = [self._start_span(p) if isinstance(p, Accepted) else p for p in parsed]
        rejected = [p for p in parsed if isinstance(p, Rejected)]
        accepted = [p for p in parsed if isinstance(p, Accepted)]
        t0 = time.perf_counter()
        try:
            with self.engine.begin() as conn:
                rejected += self._create(conn, accepted)
        except DBAPIError as exc:
            if is_outage(exc):
                raise
            # Another writer (REST, a rebalanced peer) inserted one of these keys meanwhile, or
            # the database refused one record's data: one by one, so that only that record fails.
            log.info("batch insert failed (%s); retrying one by one", type(exc).__name__)
            rejected = [p for p in parsed if isinstance(p, Rejected)]
            for a in accepted:
                rejected += self._create_one(a)
        INGEST_BATCH_SECONDS.observe(time.perf_counter() - t0)
        self.stats["batches"] += 1
        for rj in rejected:
            if (span := self._spans.pop(id(rj.record), None)) is not None:
                span.set_attribute("dayzero.outcome", "dlq")
                trace_error(span, rj.reason, rj.detail)
        for span in self._spans.values():
            span.end()
        self._spans = {}
        if rejected:
            self._dead_letter(rejected)

    def _create_one(self, a: Accepted) -> list[Rejected]:
        try:
            with self.engine.begin() as conn:
                return self._create(conn, [a])
        except DBAPIError as exc:
            if is_outage(exc) or isinstance(exc, IntegrityError):
                raise  # an outage is waited out; a key race cannot happen twice for one record
            detail = f"the database refused this record: {type(exc.orig).__name__}: {exc.orig}"
            return [Rejected(a.record, "invalid_data", detail[:1000])]

    def _start_span(self, a: Accepted) -> Accepted:
        r = a.record
        span = tracer.start_span(
            f"{r.topic} process",
            context=context_of(a.traceparent),
            kind=SpanKind.CONSUMER,
            attributes={
                "messaging.system": "kafka",
                "messaging.operation.type": "process",
                "messaging.destination.name": r.topic,
                "messaging.destination.partition.id": str(r.partition),
                "messaging.kafka.offset": r.offset,
                "messaging.kafka.message.key": a.key,
                "dayzero.tenant": a.message.tenant,
            },
        )
        self._spans[id(r)] = span
        ctx = span.get_span_context()
        return replace(a, traceparent=f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{ctx.trace_flags:02x}")

    def _create(self, conn: Any, accepted: list[Accepted]) -> list[Rejected]:
        rejected: list[Rejected] = []
        simple = [a for a in accepted if not a.message.attachments]
        specs = [self._spec(a) for a in simple]
        outcomes: list[tuple[str, bool] | IdempotencyConflict | InvalidSubmission] = list(
            create_tasks(conn, specs, self.settings.budgets) if specs else []
        )
        with_files = [a for a in accepted if a.message.attachments]
        for a in with_files:  # rare: inline or uploaded images, via the REST path's code
            try:
                with conn.begin_nested():
                    outcomes.append(
                        submit_task(
                            conn,
                            a.message,
                            a.message.tenant,
                            self.settings.budgets,
                            self.settings.blob_dir,
                            idempotency_key=a.key,
                            traceparent=a.traceparent,
                        )
                    )
            except (IdempotencyConflict, InvalidSubmission) as exc:
                outcomes.append(exc)
        for a, out in zip(simple + with_files, outcomes, strict=True):
            if isinstance(out, IdempotencyConflict):
                rejected.append(Rejected(a.record, "idempotency_conflict", str(out)))
            elif isinstance(out, InvalidSubmission):
                rejected.append(Rejected(a.record, out.reason, out.detail))
            else:
                outcome = "created" if out[1] else "duplicate"
                if (span := self._spans.get(id(a.record))) is not None:
                    span.set_attributes({"dayzero.task_id": out[0], "dayzero.outcome": outcome})
                self.stats[outcome] += 1
                self._pending += out[1]
                INGEST_MESSAGES.labels(outcome).inc()
                TASKS_SUBMITTED.labels("kafka", "created" if out[1] else "replayed").inc()
        return rejected

    def _spec(self, a: Accepted) -> NewTask:
        m = a.message
        return to_new_task(m, m.tenant, idempotency_key=a.key, attachment_ids=[], traceparent=a.traceparent)

    def _dead_letter(self, rejected: list[Rejected]) -> None:
        self._producer.renew_if_suspect()
        futures = []
        for rj in rejected:
            r = rj.record
            headers = [h for h in (r.headers or ()) if not h[0].startswith("dlq-")] + [
                ("dlq-reason", rj.reason.encode()),
                ("dlq-error", rj.detail.encode("utf-8", "replace")[:2000]),
                ("dlq-source-topic", r.topic.encode()),
                ("dlq-source-partition", str(r.partition).encode()),
                ("dlq-source-offset", str(r.offset).encode()),
            ]
            value = r.value if r.value is None or len(r.value) <= self.max_message_bytes else r.value[:1024]
            futures.append(self.producer.send(self.kafka.dlq_topic, key=r.key, value=value, headers=headers))
        self.producer.flush()
        for f in futures:
            f.get(timeout=30)  # a failed DLQ write must not let the offset commit happen
        self.stats["dlq"] += len(rejected)
        INGEST_MESSAGES.labels("dlq").inc(len(rejected))
        log.info("dead-lettered %d record(s): %s", len(rejected), sorted({r.reason for r in rejected}))

    def _commit_offsets(self, records: list[Any]) -> None:
        from kafka import TopicPartition
        from kafka.errors import CommitFailedError
        from kafka.structs import OffsetAndMetadata

        last: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            last[tp] = max(last.get(tp, -1), r.offset)
        try:
            self.consumer.commit(
                {
                    tp: OffsetAndMetadata(off + 1, self.incarnations.marker(tp.topic), -1)
                    for tp, off in last.items()
                }
            )
        except CommitFailedError as exc:
            # The group rebalanced: the new owner redelivers, the idempotent insert absorbs it.
            log.warning("offset commit failed after rebalance: %s", exc)

    # -- back-pressure -------------------------------------------------------------------------
    def pending_count(self) -> int:
        cap = self.kafka.max_pending + 1
        inner = (
            select(tasks_t.c.id)
            .where(tasks_t.c.status.in_([TaskStatus.PENDING.value, TaskStatus.READY.value]))
            .limit(cap)
            .subquery()
        )
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(inner)).scalar_one())

    def _apply_back_pressure(self) -> None:
        # The DB count is refreshed every 0.5 s, or at once when this process's own inserts since
        # then may have crossed the limit: overshoot is bounded by one batch.
        now = time.monotonic()
        if now - self._pending_checked >= 0.5 or (
            not self.paused and self._pending >= self.kafka.max_pending
        ):
            self._pending_checked = now
            n = self._pending = self.pending_count()
            if not self.paused and n >= self.kafka.max_pending:
                self.paused = True
                log.warning("%d tasks pending: pausing ingest", n)
            elif self.paused and n < self.kafka.max_pending * self.kafka.resume_fraction:
                self.paused = False
                self.consumer.resume(*self.consumer.paused())
                log.info("%d tasks pending: resuming ingest", n)
            INGEST_PAUSED.set(1 if self.paused else 0)
        if self.paused:
            assigned = self.consumer.assignment()
            if assigned:
                self.consumer.pause(*assigned)  # again after a rebalance, which clears pauses


def make_consumer(bootstrap: str, kafka: KafkaSettings, **overrides: Any) -> Any:
    from kafka import KafkaConsumer

    cfg: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "group_id": kafka.group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "max_poll_records": kafka.batch_max,
        "session_timeout_ms": kafka.session_timeout_ms,
        "heartbeat_interval_ms": kafka.heartbeat_interval_ms,
        "max_poll_interval_ms": kafka.max_poll_interval_ms,
        "client_id": "dayzero-ingest",
    }
    cfg.update(overrides)
    consumer = KafkaConsumer(**cfg)
    consumer.subscribe([kafka.tasks_topic])
    return consumer


def make_dlq_producer(bootstrap: str, **overrides: Any) -> Any:
    from kafka import KafkaProducer

    cfg: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "acks": "all",
        "linger_ms": 5,
        "request_timeout_ms": 10_000,  # a broker that is away shows within 20 s, as for the relay
        "delivery_timeout_ms": 20_000,
        "client_id": "dayzero-dlq",
    }
    cfg.update(overrides)
    return KafkaProducer(**cfg)

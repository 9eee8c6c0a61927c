"""Which incarnation of a topic the ingest consumer reads: a topic deleted and re-created under it.

A re-created topic starts its offsets at 0 again. A consumer whose position (say 30) lies inside
the new topic's range goes on fetching at 30 and silently skips the new records 0-29 (kafka-python
resets only a position past the end). The topic's id (KIP-516, reported in metadata by Kafka >= 2.8
and by tansu) tells the incarnations apart:

- before a polled batch is handled, each topic's id is asked of the broker (a metadata request
  of its own, ~1 ms; the consumer's metadata refresh waits out a 100 ms backoff) and compared
  with the one the consumer read before: a new id means the topic was re-created, so the batch's
  records of that topic are dropped (they sit at stale positions) and its partitions restart from
  the beginning;
- the id is committed with the offset (the commit's metadata), so a restarted ingest whose group
  kept an offset of the old topic finds the mismatch too (where the broker keeps commit metadata;
  tansu does not, and drops a deleted topic's offsets instead);
- keyless records' derived keys carry the id (`Ingestor.parse`), so a record of the new topic never
  takes the key of an old task at the same offset.

A broker that reports no ids leaves all of this off (`current` is None).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)

MARKER_PREFIX = "topic-id:"


class TopicIncarnations:
    def __init__(self, consumer: Any, *, request_timeout_ms: int = 5000):
        self.consumer = consumer
        self.request_timeout_ms = request_timeout_ms
        self._seen: dict[str, str] = {}  # topic -> the id of the incarnation read so far
        self._admin: Any = None  # a metadata client of its own: asking costs ~1 ms, no backoff
        self.restarts = 0  # partitions restarted from the beginning

    @property
    def _cluster(self) -> Any:
        return getattr(self.consumer, "_cluster", None)

    def id_of(self, topic: str) -> str | None:
        """The id of the incarnation whose records are being handled."""
        return self._seen.get(topic)

    def marker(self, topic: str) -> str:
        """The commit metadata kept with the offset."""
        topic_id = self._seen.get(topic)
        return f"{MARKER_PREFIX}{topic_id}" if topic_id else ""

    def current(self, topics: Iterable[str]) -> dict[str, str | None]:
        """Each topic's id as the broker reports it now (None: it reports none). Where the broker
        cannot be asked, the consumer's last metadata answers (never an error: the batch in hand
        must be handled)."""
        topics = sorted(set(topics))
        try:
            if self._admin is None:
                from kafka import KafkaAdminClient

                self._admin = KafkaAdminClient(
                    bootstrap_servers=self.consumer.config["bootstrap_servers"],
                    client_id="dayzero-ingest-metadata",
                    request_timeout_ms=self.request_timeout_ms,
                )
            described = {t["name"]: t.get("topic_id") for t in self._admin.describe_topics(topics)}
            return {t: str(described[t]) if described.get(t) else None for t in topics}
        except Exception as exc:
            log.warning("could not read the ids of %s (%s): using the consumer's metadata", topics, exc)
            self.close()
            cluster = self._cluster
            ids = {t: cluster.topic_id(t) for t in topics} if cluster is not None else {}
            return {t: str(ids[t]) if ids.get(t) else None for t in topics}

    def close(self) -> None:
        if self._admin is not None:
            admin, self._admin = self._admin, None
            try:
                admin.close()
            except Exception:  # closing a client whose broker is away
                log.debug("metadata client close failed", exc_info=True)

    def check(self, records: list[Any]) -> list[Any]:
        """The records of `records` to handle: those of a topic re-created since the consumer last
        read it are dropped and its partitions restarted from the beginning."""
        topics = {r.topic for r in records}
        if self._cluster is None or not topics:
            return records
        now = self.current(topics)
        recreated = {t for t in topics if self._recreated(t, now[t], [r for r in records if r.topic == t])}
        if not recreated:
            return records
        parts = [tp for tp in self.consumer.assignment() if tp.topic in recreated]
        if parts:
            self.consumer.seek_to_beginning(*parts)
        self.restarts += len(parts)
        log.warning(
            "topic(s) %s were re-created (new topic id): %d partition(s) restart from the beginning",
            sorted(recreated),
            len(parts),
        )
        return [r for r in records if r.topic not in recreated]

    def _recreated(self, topic: str, now: str | None, records: Iterable[Any]) -> bool:
        if now is None:
            return False
        before = self._seen.get(topic)
        self._seen[topic] = now
        if before is None:
            before = self._committed_id(topic, {r.partition for r in records})
        return before is not None and before != now

    def _committed_id(self, topic: str, partitions: set[int]) -> str | None:
        """The id committed with the group's offset of one of `partitions` (first sight only)."""
        from kafka import TopicPartition

        for p in sorted(partitions):
            try:
                committed = self.consumer.committed(TopicPartition(topic, p), metadata=True)
            except Exception as exc:  # the check is best effort; the batch is handled as polled
                log.warning("could not read the committed offset of %s:%d: %s", topic, p, exc)
                return None
            meta = getattr(committed, "metadata", None) or ""
            if meta.startswith(MARKER_PREFIX):
                return meta[len(MARKER_PREFIX) :]
        return None

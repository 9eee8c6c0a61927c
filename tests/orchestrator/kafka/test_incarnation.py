"""`TopicIncarnations` where the broker keeps commit metadata (tansu does not, so the restart case
is checked here against a consumer double; the live case is in test_ingest_hostile.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from kafka import TopicPartition
from kafka.structs import OffsetAndMetadata

from orchestrator.kafka.incarnation import TopicIncarnations


class _Consumer:
    def __init__(self, committed_meta: str | None):
        self._cluster = object()  # the broker reports topic ids
        self.config = {"bootstrap_servers": "unused"}
        self.meta = committed_meta
        self.sought: list[TopicPartition] = []

    def committed(self, tp: TopicPartition, metadata: bool = False) -> Any:
        return OffsetAndMetadata(30, self.meta, -1) if self.meta is not None else None

    def assignment(self) -> set[TopicPartition]:
        return {TopicPartition("tasks", 0), TopicPartition("tasks", 1), TopicPartition("other", 0)}

    def seek_to_beginning(self, *tps: TopicPartition) -> None:
        self.sought += tps


def _records(n: int) -> list[Any]:
    return [SimpleNamespace(topic="tasks", partition=0, offset=30 + i) for i in range(n)]


def _incarnations(consumer: _Consumer, topic_id: str) -> TopicIncarnations:
    inc = TopicIncarnations(consumer)
    inc.current = lambda topics: {t: topic_id for t in topics}  # type: ignore[method-assign]
    return inc


def test_a_restarted_ingest_finds_the_offset_was_committed_for_an_older_topic():
    consumer = _Consumer("topic-id:old-id")
    inc = _incarnations(consumer, "new-id")
    assert inc.check(_records(3)) == []  # stale positions: dropped
    assert sorted(consumer.sought) == [TopicPartition("tasks", 0), TopicPartition("tasks", 1)]
    assert inc.id_of("tasks") == "new-id" and inc.marker("tasks") == "topic-id:new-id"


def test_the_same_topic_or_no_marker_keeps_the_batch():
    for meta in ("topic-id:same-id", "", None):
        consumer = _Consumer(meta)
        inc = _incarnations(consumer, "same-id")
        assert len(inc.check(_records(3))) == 3 and consumer.sought == []

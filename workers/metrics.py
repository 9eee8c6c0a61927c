"""Prometheus metrics of the Celery workers (docs/observability.md lists them).

Prefork children each count their own jobs; `dayzero worker --metrics-port` serves them all
through prometheus_client's multiprocess mode (one file per child in PROMETHEUS_MULTIPROC_DIR).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

JOBS = Counter("dayzero_worker_jobs_total", "jobs run by a worker, by job and outcome", ["job", "outcome"])
JOB_SECONDS = Histogram(
    "dayzero_worker_job_duration_seconds",
    "time a worker spent on one job",
    ["job"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
)
PREPROCESS_BYTES = Counter("dayzero_preprocess_input_bytes_total", "attachment bytes preprocessed")
PREPROCESS_PIXELS = Counter("dayzero_preprocess_pixels_total", "source pixels preprocessed (h x w)")
PREPROCESS_IMAGES = Counter(
    "dayzero_preprocess_images_total", "images preprocessed, by whether the cache had them", ["cache"]
)
PREPROCESS_REDACTIONS = Counter(
    "dayzero_preprocess_redactions_total", "regions redacted (faces, documents)", ["kind"]
)


class QueueDepthCollector(Collector):
    """`dayzero_celery_queue_depth{queue}`: messages waiting in each queue, from the broker at
    scrape time (a passive declare: Redis and RabbitMQ both answer it)."""

    def __init__(self, app: Any, queues: list[str]):
        self.app, self.queues = app, queues

    def describe(self) -> Iterator[GaugeMetricFamily]:
        yield self._family()

    @staticmethod
    def _family() -> GaugeMetricFamily:
        return GaugeMetricFamily(
            "dayzero_celery_queue_depth", "messages waiting in a Celery queue", labels=["queue"]
        )

    def collect(self) -> Iterator[GaugeMetricFamily]:
        from kombu.exceptions import ChannelError, OperationalError

        fam = self._family()
        try:
            with self.app.connection_for_read() as conn:
                for q in self.queues:
                    # A channel per queue: on AMQP a refused passive declare closes its channel.
                    with conn.channel() as channel:
                        try:
                            depth = _depth(channel, q)
                        except ChannelError:  # AMQP: no such queue (none declared it yet)
                            depth = 0
                    fam.add_metric([q], depth)
        except (OperationalError, OSError):  # the broker is away: the scrape answers without it
            log.warning("queue depth unavailable", exc_info=True)
            return
        yield fam


def _depth(channel: Any, queue: str) -> int:
    # kombu's virtual transports (Redis, SQS, memory) count with `_size` (the length of the
    # queue's lists: LLEN on Redis, 0 for a queue never used); their passive declare would test
    # the key's existence instead, which is false for an empty Redis queue and, under
    # `global_keyprefix`, ignores the prefix. AMQP brokers answer a passive declare.
    size = getattr(channel, "_size", None)
    if size is not None:
        return int(size(queue))
    return int(channel.queue_declare(queue, passive=True).message_count)

"""Kafka clients built anew after a broker error.

A kafka-python producer can be left in a state it never leaves: after a broker restart the
broker has forgotten the producer's id, and every later send fails (`InitProducerIdResponse`,
`UnknownProducerId`). Waiting does not help; a new producer does. The relay and ingest's
dead-letter producer hold theirs through `Renewable`: a loop marks it suspect when a turn
fails with a Kafka error, and the next turn builds a fresh one first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from typing import Any

log = logging.getLogger(__name__)


def is_kafka_error(exc: BaseException) -> bool:
    try:
        from kafka.errors import KafkaError
    except ImportError:  # a look-alike client without kafka-python
        return False
    return isinstance(exc, KafkaError)


class Renewable:
    """A client (`current`) and the factory that builds a replacement (None: never replaced)."""

    def __init__(self, current: Any, factory: Callable[[], Any] | None, what: str):
        self.current: Any = current
        self.factory, self.what = factory, what
        self.suspect = False

    def note(self, exc: BaseException) -> None:
        """A turn failed with `exc`: after a Kafka error the client is replaced before the next."""
        if is_kafka_error(exc) and self.factory is not None:
            self.suspect = True

    def renew_if_suspect(self) -> None:
        """Build the replacement (raises while the broker is away: the caller waits that out)."""
        if not self.suspect or self.factory is None:
            return
        old, self.current = self.current, None
        if old is not None:
            with suppress(Exception):  # it is being replaced because it is broken
                old.close(timeout=0)
        self.current = self.factory()
        self.suspect = False
        log.info("new %s after a broker error", self.what)

    def close(self) -> None:
        if self.current is not None:
            self.current.close()

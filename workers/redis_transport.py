"""kombu's Redis transport, with one fix: a channel whose connection was already closed raises
a connection error instead of an `AttributeError` when asked for a client.

Why: when Redis goes away under a worker, Celery closes the consumer's connection with
`ignore_errors` (connection errors only); closing a channel first restores its unacked
messages, which asks the channel for a new client, whose parameters come from the connection
it belongs to; if that connection was already closed (its `client` is None), kombu raised
`AttributeError`, which escaped `ignore_errors` and ended the worker ("Unrecoverable error",
3 workers in a 300 s soak with 15 Redis restarts). As a connection error it is ignored like the
others: the worker reconnects and waits the outage out. The messages that could not be restored
then come back by the visibility timeout, as those of a worker that died do.

Selected by `workers.celery_app` (`broker_transport`) for `redis://` and `rediss://` brokers.
"""

from __future__ import annotations

import logging
from typing import Any

from kombu.transport import redis as kombu_redis
from redis.exceptions import ConnectionError as RedisConnectionError

log = logging.getLogger(__name__)


class Channel(kombu_redis.Channel):
    def _connparams(self, asynchronous: bool = False) -> Any:
        if self.connection is None or self.connection.client is None:
            log.warning(
                "a channel of a closed broker connection asked for a client: treated as a connection error"
            )
            raise RedisConnectionError("the broker connection of this channel is closed")
        return super()._connparams(asynchronous=asynchronous)


class Transport(kombu_redis.Transport):
    Channel = Channel


TRANSPORT = f"{__name__}:Transport"

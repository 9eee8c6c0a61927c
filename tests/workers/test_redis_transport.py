"""A worker survives Redis going away under it (issue 39): closing a consumer connection whose
channel holds unacked messages after the connection's transport was already closed used to
raise `AttributeError` out of Celery's `ignore_errors`, which ended the worker process
("Unrecoverable error"; 3 workers in a soak with 15 Redis restarts)."""

from __future__ import annotations

import uuid

from kombu import Queue
from kombu.common import ignore_errors

from tests.workers.conftest import REDIS_URL
from workers.celery_app import make_celery_app
from workers.redis_transport import Transport


def test_the_worker_app_uses_the_fixed_redis_transport():
    app = make_celery_app(REDIS_URL)
    with app.connection_for_write() as conn:
        assert isinstance(conn.transport, Transport)


def test_closing_a_channel_of_a_closed_connection_is_a_connection_error_not_a_crash():
    app = make_celery_app(REDIS_URL)
    queue = Queue(f"dz-transport-{uuid.uuid4().hex[:8]}")
    conn = app.connection_for_write()
    with conn.Producer() as producer:
        producer.publish({"x": 1}, routing_key=queue.name, declare=[queue])
    channel = conn.default_channel
    message = channel.basic_get(queue.name, no_ack=False)  # delivered, not acked: to restore
    assert message is not None
    channel.connection.client = None  # what a transport closed under the channel leaves behind
    ignore_errors(conn, conn.close)  # Celery's own close on a connection error; raised before
    with app.connection_for_write() as fresh:  # the worker reconnects; the message comes back later
        fresh.default_channel.queue_delete(queue.name)

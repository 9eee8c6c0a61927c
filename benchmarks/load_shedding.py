"""Load shedding at the front door (`core/frontdoor.py`) of both HTTP servers, measured from the
outside with a bounded load generator.

For each server: the unloaded latency (one request at a time), the capacity (closed loop:
`--concurrency` clients back to back, accepted requests per second), then an open loop offering
`--overload`x that capacity for `--overload-s` seconds (arrivals on a fixed schedule, never more
than `--max-outstanding` requests open at once: the generator is bounded too). Reported: p50/p99
of the accepted requests against the unloaded p99 (target: within 2x), the answers by status
code, whether every 429/503 carried `Retry-After`, and the same overload with shedding off for
comparison.

- REST: `dayzero serve` on a scratch PostgreSQL database, no runner, `POST /v1/tasks`; latency is
  the whole request.
- Inference: `dayzero infer serve --dummy` (CPU, small random model), streaming
  `/v1/chat/completions`; latency is the time to the first streamed byte (TTFT).

    python -m benchmarks.load_shedding [--only rest|inference] [--overload-s 10] [--out docs/results/load_shedding.json]

PostgreSQL at `DAYZERO_BENCH_PG_URL` (default postgres@127.0.0.1:5432). Progress goes to stderr,
the figures to stdout and `--out` as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

ADMIN_URL = os.environ.get("DAYZERO_BENCH_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REPO = Path(__file__).resolve().parents[1]

# One request over a pool: returns (status, seconds to what counts as its latency, had Retry-After).
Shot = Callable[["Pool"], Awaitable[tuple[int, float, bool]]]


class Pool:
    """A lean HTTP/1.1 client over asyncio streams, keep-alive connections reused. The load
    generator shares the machine with the server: httpx costs it several times more CPU per
    request, which would be measured as the server's latency."""

    def __init__(self, base: str, size: int) -> None:
        host, port = base.removeprefix("http://").split(":")
        self.host, self.port, self.size = host, int(port), size
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []
        self._sem = asyncio.Semaphore(size)

    async def request(
        self,
        method: str,
        path: str,
        body: bytes = b"",
        headers: dict[str, str] | None = None,
        *,
        first_byte: bool = False,
    ) -> tuple[int, dict[str, str], float]:
        """(status, headers, seconds to the end of the body, or to its first byte with `first_byte`).
        With `first_byte` the connection is closed after the body (a stream is read to its end)."""
        async with self._sem:
            t0 = time.perf_counter()
            rw = self._idle.pop() if self._idle else await asyncio.open_connection(self.host, self.port)
            reader, writer = rw
            head = f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(body)}\r\n"
            for k, v in (headers or {}).items():
                head += f"{k}: {v}\r\n"
            writer.write(head.encode() + b"\r\n" + body)
            try:
                status_line = await reader.readline()
                if not status_line:
                    raise ConnectionError("closed")
                status = int(status_line.split()[1])
                hdrs: dict[str, str] = {}
                while (line := await reader.readline()) not in (b"\r\n", b""):
                    k, _, v = line.decode().partition(":")
                    hdrs[k.strip().lower()] = v.strip()
                secs = time.perf_counter() - t0
                if "content-length" in hdrs:
                    await reader.readexactly(int(hdrs["content-length"]))
                    secs = secs if first_byte else time.perf_counter() - t0
                    if hdrs.get("connection") == "close":
                        writer.close()
                    else:
                        self._idle.append(rw)
                    return status, hdrs, secs
                chunk = await reader.read(1)  # a chunked stream: its first byte, then to its end
                secs = time.perf_counter() - t0
                while chunk:
                    chunk = await reader.read(65536)
                    if b"0\r\n\r\n" in chunk[-7:]:
                        break
                if not first_byte:
                    secs = time.perf_counter() - t0
                self._idle.append(rw)
                return status, hdrs, secs
            except BaseException:
                writer.close()
                raise

    async def close(self) -> None:
        for _, w in self._idle:
            w.close()


def progress(msg: str) -> None:
    print(f"[load_shedding] {msg}", file=sys.stderr, flush=True)


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return round(s[min(len(s) - 1, int(q * len(s)))] * 1000, 2)  # ms


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"the server exited with {proc.returncode}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not answer within {timeout_s} s")


@contextlib.contextmanager
def server(cmd: list[str], env: dict[str, str], probe: str, log: Path, start_s: float) -> Iterator[None]:
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_http(probe, proc, start_s)
            yield
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)


async def closed_loop(base: str, shot: Shot, clients: int, n_or_s: float, by_time: bool) -> dict[str, Any]:
    """`clients` back-to-back loops: `n_or_s` requests in all, or for `n_or_s` seconds."""
    lat: list[float] = []
    codes: Counter[int] = Counter()
    left = int(n_or_s)
    end = time.perf_counter() + n_or_s

    async def loop(client: Pool) -> None:
        nonlocal left
        while (time.perf_counter() < end) if by_time else left > 0:
            left -= 1
            status, secs, _ = await shot(client)
            codes[status] += 1
            if status < 400:
                lat.append(secs)

    client = Pool(base, clients)
    t0 = time.perf_counter()
    await asyncio.gather(*(loop(client) for _ in range(clients)))
    wall = time.perf_counter() - t0
    await client.close()
    return {
        "requests": sum(codes.values()),
        "codes": dict(codes),
        "accepted_per_s": round(len(lat) / wall, 2),
        "p50_ms": pct(lat, 0.5),
        "p99_ms": pct(lat, 0.99),
    }


async def open_loop(
    base: str, shot: Shot, rate: float, seconds: float, max_outstanding: int
) -> dict[str, Any]:
    """Arrivals every 1/rate s for `seconds`; an arrival that finds `max_outstanding` requests
    open is counted as not sent (the generator's own bound), never queued in the generator."""
    lat: list[float] = []
    codes: Counter[str] = Counter()
    retry_after_missing = 0
    open_now, not_sent = 0, 0
    tasks: set[asyncio.Task[None]] = set()

    async def one(client: Pool) -> None:
        nonlocal open_now, retry_after_missing
        try:
            status, secs, has_retry_after = await shot(client)
        except (OSError, ValueError, asyncio.IncompleteReadError) as exc:
            codes[type(exc).__name__] += 1
        else:
            codes[str(status)] += 1
            if status < 400:
                lat.append(secs)
            elif status in (429, 503) and not has_retry_after:
                retry_after_missing += 1
        finally:
            open_now -= 1

    client = Pool(base, max_outstanding)
    t0 = time.perf_counter()
    n = int(rate * seconds)
    for i in range(n):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if open_now >= max_outstanding:
            not_sent += 1
            continue
        open_now += 1
        t = asyncio.create_task(one(client))
        tasks.add(t)
        t.add_done_callback(tasks.discard)
    offered_wall = time.perf_counter() - t0
    await asyncio.gather(*tasks)
    await client.close()
    return {
        "offered_per_s": round(rate, 2),
        "offered_wall_s": round(offered_wall, 2),
        "sent": n - not_sent,
        "not_sent_generator_bound": not_sent,
        "codes": dict(codes),
        "accepted": len(lat),
        "shed": sum(v for k, v in codes.items() if k in ("429", "503")),
        "shed_without_retry_after": retry_after_missing,
        "accepted_p50_ms": pct(lat, 0.5),
        "accepted_p99_ms": pct(lat, 0.99),
        "accepted_max_ms": pct(lat, 1.0),
    }


def measure(
    base: str, shot: Shot, args: argparse.Namespace, clients: int, what: str, capacity: dict[str, Any] | None
) -> dict[str, Any]:
    """Unloaded latency, the capacity (measured here when not given: on the server without
    shedding, whose closed loop is not cut short by 429s), then the overload at a multiple of it."""
    progress(f"{what}: unloaded ({args.unloaded_n} requests, one at a time)")
    asyncio.run(closed_loop(base, shot, 1, 20, by_time=False))  # warm-up
    unloaded = asyncio.run(closed_loop(base, shot, 1, args.unloaded_n, by_time=False))
    out: dict[str, Any] = {"unloaded": unloaded}
    if capacity is None:
        progress(
            f"{what}: unloaded p99 {unloaded['p99_ms']} ms; capacity ({clients} clients, {args.capacity_s} s)"
        )
        capacity = out["capacity"] = asyncio.run(
            closed_loop(base, shot, clients, args.capacity_s, by_time=True)
        )
    rate = args.overload * capacity["accepted_per_s"]
    progress(
        f"{what}: capacity {capacity['accepted_per_s']}/s; offering {rate:.1f}/s for {args.overload_s} s"
    )
    over = out["overload"] = asyncio.run(open_loop(base, shot, rate, args.overload_s, args.max_outstanding))
    ratio = out["accepted_p99_over_unloaded_p99"] = (
        round(over["accepted_p99_ms"] / unloaded["p99_ms"], 2)
        if over["accepted_p99_ms"] and unloaded["p99_ms"]
        else None
    )
    progress(f"{what}: accepted p99 {over['accepted_p99_ms']} ms = {ratio}x unloaded; codes {over['codes']}")
    return out


# -- REST -------------------------------------------------------------------------------------


@contextlib.contextmanager
def scratch_database() -> Iterator[str]:
    from orchestrator.db.engine import make_engine

    name = f"dz_bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield ADMIN_URL.rsplit("/", 1)[0] + "/" + name
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


def rest_shot(key: str) -> Shot:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    body = json.dumps({"goal": "summarise the attached notes", "budget": {"max_steps": 5}}).encode()

    async def shot(client: Pool) -> tuple[int, float, bool]:
        status, hdrs, secs = await client.request("POST", "/v1/tasks", body, headers)
        return status, secs, "retry-after" in hdrs

    return shot


def run_rest(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from orchestrator.auth import create_api_key
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    out: dict[str, Any] = {"route": "POST /v1/tasks", "server": "dayzero serve (1 process, no runner)"}
    with scratch_database() as url:
        engine = make_engine(url)
        migrate.upgrade(engine)
        with engine.begin() as conn:
            key = create_api_key(conn, "bench").key
        engine.dispose()
        capacity = None
        in_flight, queue, wait = args.rest_limits.split(",")
        shed = {
            "DAYZERO_INGRESS_MAX_IN_FLIGHT": in_flight,
            "DAYZERO_INGRESS_MAX_QUEUE": queue,
            "DAYZERO_INGRESS_MAX_QUEUE_WAIT_S": wait,
        }
        for label, extra in (("no_shedding", {"DAYZERO_INGRESS_MAX_IN_FLIGHT": "0"}), ("shedding", shed)):
            port = free_port()
            env = {**os.environ, "DATABASE_URL": url, "PYTHONPATH": str(REPO), **extra}
            env.pop("DAYZERO_KAFKA_BOOTSTRAP_SERVERS", None)
            cmd = [
                sys.executable,
                "-m",
                "orchestrator.cli",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
            ]
            base = f"http://127.0.0.1:{port}"
            with server(cmd, env, f"{base}/healthz", work / f"rest-{label}.log", 60):
                out[label] = measure(base, rest_shot(key), args, args.concurrency, f"rest/{label}", capacity)
                capacity = capacity or out[label]["capacity"]
    out["limits"] = {
        "max_in_flight": int(in_flight),
        "max_queue": int(queue),
        "max_queue_wait_s": float(wait),
    }
    return out


# -- inference --------------------------------------------------------------------------------


def inference_shot(max_tokens: int) -> Shot:
    body = json.dumps({
        "model": "dummy",
        "messages": [{"role": "user", "content": "say something about load shedding"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": True,
    }).encode()  # fmt: skip
    headers = {"Content-Type": "application/json"}

    async def shot(client: Pool) -> tuple[int, float, bool]:
        status, hdrs, secs = await client.request(
            "POST", "/v1/chat/completions", body, headers, first_byte=True
        )
        return status, secs, "retry-after" in hdrs

    return shot


def run_inference(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    seqs = args.max_num_seqs
    out: dict[str, Any] = {
        "route": "POST /v1/chat/completions (stream), latency = time to first byte",
        "server": f"dayzero infer serve --dummy --device cpu --max-num-seqs {seqs}",
        "max_tokens": args.max_tokens,
    }
    capacity = None
    for label, extra in (("no_shedding", ["--max-in-flight", "0"]), ("shedding", args.shed_flags.split())):
        port = free_port()
        cmd = [sys.executable, "-m", "orchestrator.cli", "infer", "serve", "--dummy", "--device", "cpu",
               "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", str(seqs), "--served-model-name", "dummy", *extra]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        base = f"http://127.0.0.1:{port}"
        with server(cmd, env, f"{base}/health", work / f"inference-{label}.log", 300):
            out[label] = measure(
                base, inference_shot(args.max_tokens), args, seqs, f"inference/{label}", capacity
            )
            capacity = capacity or out[label]["capacity"]
    out["shedding_flags"] = f"(defaults) {args.shed_flags}".strip()
    return out


def summarise(figures: dict[str, Any]) -> None:
    """Per server: accepted p99 at overload over the unloaded p99, against both unloaded baselines
    (each run measures its own moments before; on a busy machine they differ)."""
    for part in ("rest", "inference"):
        if part not in figures:
            continue
        f = figures[part]
        p99 = f["shedding"]["overload"]["accepted_p99_ms"]
        bases = {k: f[k]["unloaded"]["p99_ms"] for k in ("shedding", "no_shedding")}
        ratios = {k: round(p99 / b, 2) if p99 and b else None for k, b in bases.items()}
        f["accepted_p99_ms_at_overload"] = p99
        f["unloaded_p99_ms"] = bases
        f["ratio_to_unloaded_p99"] = ratios
        f["target_within_2x"] = all(r is not None and r <= 2.0 for r in ratios.values())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", choices=("rest", "inference"), default=None)
    ap.add_argument("--unloaded-n", type=int, default=200)
    ap.add_argument("--capacity-s", type=float, default=8.0)
    ap.add_argument("--overload", type=float, default=2.0, help="offered load as a multiple of capacity")
    ap.add_argument("--overload-s", type=float, default=10.0)
    ap.add_argument("--concurrency", type=int, default=16, help="REST closed-loop clients")
    ap.add_argument("--max-outstanding", type=int, default=512, help="the generator's own bound")
    ap.add_argument(
        "--rest-limits",
        default="4,16,0.01",
        help="max_in_flight,max_queue,max_queue_wait_s of the REST shedding run (this 2-core box's tuning; "
        "the defaults are looser)",
    )
    ap.add_argument("--max-num-seqs", type=int, default=8, help="the inference server's slots")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument(
        "--shed-flags",
        default="",
        help="extra `infer serve` flags of the shedding run, e.g. '--max-queue-wait 0.1'",
    )
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    figures: dict[str, Any] = {
        "benchmark": "load_shedding",
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
        },
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
    }
    with tempfile.TemporaryDirectory(prefix="dz-shed-") as tmp:
        work = Path(tmp)
        if args.only in (None, "rest"):
            figures["rest"] = run_rest(args, work)
        if args.only in (None, "inference"):
            figures["inference"] = run_inference(args, work)
    figures["load_average_at_end"] = os.getloadavg()
    summarise(figures)
    text = json.dumps(figures, indent=1)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Liveness, readiness and metrics of the long-running non-HTTP processes (ingest, relay).

Outages are waited out, not exited (issue 15): a loop that loses the database or the broker backs
off and retries (`Backoff`), and says so on `/readyz` (503 while it cannot do its work) while
`/healthz` stays 200 as long as the loop turns. Exiting would only turn a short outage into a
crash loop with a restart delay that grows on every attempt.

The probe server binds 127.0.0.1 unless told otherwise: a pod's probes and scraper need the pod
IP (`--metrics-host 0.0.0.0` or DAYZERO_METRICS_HOST), a laptop does not.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TypeVar

from orchestrator.metrics import render
from orchestrator.retry import backoff_cap_s

T = TypeVar("T")

log = logging.getLogger(__name__)


# Errors of a dependency that is down or restarting (database, broker): retried with backoff.
# Anything else is a bug and still ends the process.
def outage_errors() -> tuple[type[BaseException], ...]:
    from kafka.errors import KafkaError
    from sqlalchemy.exc import DBAPIError

    from orchestrator.db.engine import DB_UNAVAILABLE

    return (*DB_UNAVAILABLE, DBAPIError, KafkaError, ConnectionError, TimeoutError)


@dataclass(slots=True)
class Backoff:
    """Exponential backoff between attempts at a dependency: base * 2^n, capped."""

    base_s: float = 0.5
    max_s: float = 30.0
    failures: int = 0

    def next_delay(self) -> float:
        self.failures += 1
        return backoff_cap_s(self.failures, self.base_s, self.max_s)  # no jitter: one process waits

    def reset(self) -> None:
        self.failures = 0


def retry_until_up(what: str, fn: Callable[[], T], stop: threading.Event, health: Health | None = None) -> T:
    """`fn()` until it succeeds, backing off while a dependency is unavailable (start-up of the
    long-running commands: a process started during an outage waits instead of crash-looping).
    Raises SystemExit(0) if `stop` is set meanwhile."""
    backoff = Backoff()
    while True:
        try:
            return fn()
        except outage_errors() as exc:
            delay = backoff.next_delay()
            if health is not None:
                health.set_unready(f"{what}: {type(exc).__name__}")
            log.warning("%s failed (%s: %s); retrying in %.1f s", what, type(exc).__name__, exc, delay)
            if stop.wait(delay):
                raise SystemExit(0) from None


@dataclass
class Health:
    """What the probes report: the loop's last turn and whether its dependencies answered."""

    liveness_timeout_s: float = 120.0
    ready: bool = False
    reason: str = "starting"
    last_beat: float = field(default_factory=time.monotonic)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def set_ready(self) -> None:
        self.ready, self.reason = True, "ok"
        self.beat()

    def set_unready(self, reason: str) -> None:
        if self.ready:
            log.warning("not ready: %s", reason)
        self.ready, self.reason = False, reason
        self.beat()

    @property
    def alive(self) -> bool:
        return time.monotonic() - self.last_beat < self.liveness_timeout_s


class _Handler(BaseHTTPRequestHandler):
    health: Health

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype = render()
            self._send(200, body, ctype)
        elif path == "/healthz":
            ok = self.health.alive
            self._json(200 if ok else 503, {"status": "ok" if ok else "stalled"})
        elif path == "/readyz":
            h = self.health
            self._json(
                200 if h.ready else 503, {"status": "ready" if h.ready else "unready", "reason": h.reason}
            )
        else:
            self._json(404, {"status": "not found"})

    def _json(self, status: int, obj: dict) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _send(self, status: int, body: bytes, ctype: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *_: object) -> None:  # probes every few seconds: no access log
        pass


def serve_probes(host: str, port: int, health: Health) -> ThreadingHTTPServer:
    """Serve /healthz, /readyz and /metrics on (host, port) in a daemon thread."""
    handler = type("ProbeHandler", (_Handler,), {"health": health})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="probes", daemon=True).start()
    log.info("probes and metrics on http://%s:%d", host, server.server_address[1])
    return server

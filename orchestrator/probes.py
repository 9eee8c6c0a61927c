"""Liveness, readiness and metrics of the long-running non-HTTP processes (ingest, relay).

Outages are waited out, not exited (issue 15): a loop that loses the database or the broker backs
off and retries (`core.outage`: one classification, one wait-out loop), and says so on `/readyz`
(503 while it cannot do its work) while `/healthz` stays 200 as long as the loop turns and has
not been stuck for `Health.stall_after_s`. Exiting at once would only turn a short outage into
a crash loop with a restart delay that grows on every attempt.

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

from core.backoff import Backoff
from core.outage import Stopped, is_outage, wait_out
from orchestrator.metrics import render

T = TypeVar("T")

log = logging.getLogger(__name__)


def retry_until_up(what: str, fn: Callable[[], T], stop: threading.Event, health: Health | None = None) -> T:
    """`fn()` until it succeeds, waiting out an unavailable dependency (start-up of the
    long-running commands: a process started during an outage waits instead of crash-looping).
    Raises SystemExit(0) if `stop` is set meanwhile."""
    try:
        return wait_out(what, fn, stop=stop, readiness=health)
    except Stopped:
        raise SystemExit(0) from None


@dataclass
class Health:
    """What the probes report: the loop's last turn and whether its dependencies answered.

    Alive while the loop turns, and while it waits out an outage for less than `stall_after_s`:
    a loop that has made no progress for that long (a client stuck in a state it cannot leave,
    a dependency that never comes back) fails liveness, so that a restart can be tried."""

    liveness_timeout_s: float = 120.0
    stall_after_s: float = 300.0
    ready: bool = False
    reason: str = "starting"
    last_beat: float = field(default_factory=time.monotonic)
    unready_since: float = field(default_factory=time.monotonic)

    def beat(self) -> None:
        self.last_beat = time.monotonic()

    def set_ready(self) -> None:
        self.ready, self.reason = True, "ok"
        self.beat()

    def set_unready(self, reason: str) -> None:
        if self.ready:
            log.warning("not ready: %s", reason)
            self.unready_since = time.monotonic()
        self.ready, self.reason = False, reason
        self.beat()

    @property
    def alive(self) -> bool:
        now = time.monotonic()
        stalled = not self.ready and now - self.unready_since >= self.stall_after_s
        return now - self.last_beat < self.liveness_timeout_s and not stalled


class _Handler(BaseHTTPRequestHandler):
    health: Health

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            body, ctype = render()
            self._send(200, body, ctype)
        elif path == "/healthz":
            ok = self.health.alive
            body = {"status": "ok"} if ok else {"status": "stalled", "reason": self.health.reason}
            self._json(200 if ok else 503, body)
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


__all__ = ["Backoff", "Health", "is_outage", "retry_until_up", "serve_probes", "wait_out"]

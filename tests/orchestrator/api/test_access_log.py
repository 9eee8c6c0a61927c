"""`dayzero serve`'s access log, read from the process's stderr: one logfmt line per request with
method, path, status, time, size and client, in every worker process; never the API key or a
query string."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import httpx

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from testing.kafka_broker import free_port
from tests.orchestrator.api.conftest import make_keys

ACCESS = re.compile(
    r"^ts=\S+Z level=info logger=dayzero\.access msg=request method=(\w+) path=(\S+) status=(\d+) "
    r"ms=[\d.]+ bytes=(\d+) client=127\.0\.0\.1$"
)


def test_serve_writes_an_access_log_without_keys(pg_url):
    engine = make_engine(pg_url)
    migrate.upgrade(engine)
    key = make_keys(engine, "acme")["acme"]
    engine.dispose()
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator.cli", "serve", "--port", str(port), "--workers", "2"],
        env={**os.environ, "DATABASE_URL": pg_url}, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        end = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < end, "server did not start"
            time.sleep(0.2)
        h = {"Authorization": f"Bearer {key}"}
        with httpx.Client(base_url=url, timeout=10) as client:
            assert client.get("/v1/tasks", params={"metadata": "order=42"}, headers=h).status_code == 200
            assert client.get("/v1/tasks", headers={"Authorization": "Bearer dz_wrong"}).status_code == 401
            assert client.get("/ui/").status_code == 200
        time.sleep(0.5)  # lines are written by each worker's log thread
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    access = [m.groups() for m in map(ACCESS.match, err.splitlines()) if m]
    assert ("GET", "/v1/tasks", "200") in [a[:3] for a in access], err
    assert ("GET", "/v1/tasks", "401") in [a[:3] for a in access]
    assert ("GET", "/ui/", "200") in [a[:3] for a in access]
    assert all(int(a[3]) > 0 for a in access if a[2] == "200")
    assert key not in err and "dz_wrong" not in err and "order=42" not in err

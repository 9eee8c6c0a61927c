"""Probes of ingest and relay: loopback by default (issue 15: the metrics port bound 0.0.0.0 with
no option), readiness that follows the dependencies, and malformed tool-job payloads."""

from __future__ import annotations

import time

import httpx

from orchestrator.cli import build_parser
from orchestrator.probes import Health, serve_probes
from workers.tool_jobs import run_tool


def test_probe_port_binds_loopback_unless_told(monkeypatch):
    monkeypatch.delenv("DAYZERO_METRICS_HOST", raising=False)
    for cmd in ("ingest", "relay", "runner"):
        args = build_parser().parse_args([cmd, "--metrics-port", "0"])
        assert args.metrics_host == "127.0.0.1"
        assert build_parser().parse_args([cmd, "--metrics-host", "0.0.0.0"]).metrics_host == "0.0.0.0"
    monkeypatch.setenv("DAYZERO_METRICS_HOST", "::")
    assert build_parser().parse_args(["ingest"]).metrics_host == "::"


def test_probes_report_readiness_and_metrics():
    health = Health()
    server = serve_probes("127.0.0.1", 0, health)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        assert server.server_address[0] == "127.0.0.1"
        r = httpx.get(url + "/readyz")
        assert r.status_code == 503 and r.json()["reason"] == "starting"
        health.set_ready()
        assert httpx.get(url + "/readyz").status_code == 200
        health.set_unready("OperationalError")
        assert httpx.get(url + "/readyz").json() == {"status": "unready", "reason": "OperationalError"}
        assert httpx.get(url + "/healthz").status_code == 200  # the loop turns: alive, if not ready
        assert "dayzero_" in httpx.get(url + "/metrics").text
    finally:
        server.shutdown()


def test_malformed_tool_job_payload_is_that_jobs_failure():
    for payload in (
        {},
        {"tool": "echo"},
        {"tool": 3, "task_id": "t", "step_index": 0, "attempt": 1, "idempotency_key": "k"},
    ):
        out = run_tool(payload)
        assert out["ok"] is False and out["error"]["kind"] == "permanent"
        assert "malformed tool job payload" in out["error"]["error"]


def test_liveness_fails_when_no_progress_is_made_for_too_long():
    # Before: /healthz stayed 200 as long as the loop turned, even when every turn failed (a
    # relay whose producer could never send again). An outage shorter than the bound stays live.
    health = Health(stall_after_s=0.3)
    health.set_ready()
    health.set_unready("relay: KafkaError")
    assert health.alive  # a fresh outage is waited out, not restarted
    time.sleep(0.4)
    health.set_unready("relay: KafkaError")  # the loop still turns, and still fails
    assert not health.alive
    health.set_ready()
    assert health.alive

"""One task is one trace across every process, and every process serves its metrics.

A task produced to Kafka runs through `dayzero ingest`, `dayzero runner`, a `dayzero worker` on the
Celery tools queue, `dayzero infer serve --dummy` (the random-weight test model) and `dayzero relay`, each a separate
process exporting spans over OTLP/HTTP (the standard OTEL_* variables) to a receiver this test
runs. The test then checks, from those spans, one trace id and its parent/child structure, and
scrapes every process's /metrics for the names and labels docs/observability.md promises.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from orchestrator.kafka.producer import send_task
from orchestrator.store import get_task
from testing.kafka_broker import consume_all, free_port
from testing.otlp_receiver import OTLPReceiver, ReceivedSpan
from testing.tool_call_proxy import ToolCallProxy

REPO = Path(__file__).resolve().parents[3]
REDIS_URL = os.environ.get("DAYZERO_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
# A database of its own: the Celery `tools` queue must not be shared with other tests' workers.
REDIS_DB = os.environ.get("DAYZERO_TEST_REDIS_TRACE_DB", "12")
CLIENT_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_SPAN = "00f067aa0ba902b7"
MODEL = "dayzero-small"


class Processes:
    def __init__(self, log_dir: Path, env: dict[str, str]):
        self.log_dir, self.env = log_dir, env
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, *args: str, **env: str) -> subprocess.Popen:
        log = (self.log_dir / f"{name}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "orchestrator.cli", *args],
            cwd=REPO,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.procs.append((name, proc))
        return proc

    def log(self, name: str) -> str:
        return (self.log_dir / f"{name}.log").read_text(errors="replace")

    def wait_http(self, name: str, url: str, timeout_s: float = 120) -> None:
        proc = dict(self.procs)[name]
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            assert proc.poll() is None, f"{name} exited:\n{self.log(name)[-3000:]}"
            try:
                if httpx.get(url, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"{name} not up at {url}:\n{self.log(name)[-3000:]}")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
        for name, proc in self.procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                proc.wait(10)
                print(f"{name} was killed")


@pytest.fixture
def otlp() -> Iterator[OTLPReceiver]:
    with OTLPReceiver() as r:
        yield r


@pytest.fixture
def procs(tmp_path, otlp, db, kafka_broker, kafka_settings) -> Iterator[Processes]:
    broker = REDIS_URL.rsplit("/", 1)[0] + "/" + REDIS_DB
    ks = kafka_settings
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "DAYZERO_", "CELERY_"))},
        "PYTHONPATH": str(REPO),
        "PYTHONUNBUFFERED": "1",
        "OTEL_EXPORTER_OTLP_ENDPOINT": otlp.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "DATABASE_URL": str(db.url.render_as_string(hide_password=False)),
        "KAFKA_BOOTSTRAP_SERVERS": kafka_broker.bootstrap,
        "DAYZERO_KAFKA_TASKS_TOPIC": ks.tasks_topic,
        "DAYZERO_KAFKA_DLQ_TOPIC": ks.dlq_topic,
        "DAYZERO_KAFKA_EVENTS_TOPIC": ks.events_topic,
        "DAYZERO_KAFKA_RESULTS_TOPIC": ks.results_topic,
        "DAYZERO_KAFKA_GROUP_ID": ks.group_id,
        "DAYZERO_KAFKA_TENANTS": ks.tenants_csv,
        "DAYZERO_KAFKA_SESSION_TIMEOUT_MS": "4000",
        "DAYZERO_KAFKA_HEARTBEAT_INTERVAL_MS": "1000",
        "CELERY_BROKER_URL": broker,
        "CELERY_RESULT_BACKEND": broker,
        "DAYZERO_TOOL_MODULES": "testing.fixture_tools",
        "DAYZERO_TEST_STATE_DIR": str(tmp_path / "state"),
        "DAYZERO_WORKSPACE_DIR": str(tmp_path / "ws"),
        "DAYZERO_BLOB_DIR": str(tmp_path / "blobs"),
        "DAYZERO_POLL_INTERVAL_S": "0.05",
        "OMP_NUM_THREADS": "1",
    }
    p = Processes(tmp_path, env)
    try:
        yield p
    finally:
        p.stop()


def _metrics(url: str) -> str:
    return httpx.get(url, timeout=5).text


def _value(text: str, series: str) -> float:
    m = re.search(rf"^{re.escape(series)} ([0-9.e+-]+)$", text, re.M)
    family = [x for x in text.splitlines() if x.startswith(series.split("{")[0])]
    assert m, f"{series} not exposed; the family has: {family}"
    return float(m.group(1))


def test_one_task_is_one_trace_across_every_process(
    procs, otlp, db, tenants, producer, kafka_settings, kafka_broker
):
    ports = {n: free_port() for n in ("inference", "ingest", "runner", "worker", "relay")}
    infer_url = f"http://127.0.0.1:{ports['inference']}"
    procs.start("inference", "infer", "serve", "--dummy", "--port", str(ports["inference"]), "--device", "cpu",
                "--served-model-name", MODEL, "--max-model-len", "4096", "--num-blocks", "512",
                "--block-size", "16", "--max-num-seqs", "4")  # fmt: skip
    procs.start("ingest", "ingest", "--metrics-port", str(ports["ingest"]))
    procs.start("relay", "relay", "--metrics-port", str(ports["relay"]))
    procs.start("worker", "worker", "--queues", "tools", "--pool", "solo", "--metrics-port", str(ports["worker"]),
                "--hostname", f"trace-{uuid.uuid4().hex[:8]}@%h")  # fmt: skip
    procs.wait_http("inference", infer_url + "/health", timeout_s=240)
    with ToolCallProxy(infer_url, "echo", {"text": "hi"}) as proxy:
        procs.start("runner", "runner", "--metrics-port", str(ports["runner"]),
                    DAYZERO_INFERENCE_URL=proxy.url, DAYZERO_INFERENCE_MODEL=MODEL)  # fmt: skip
        for name in ("ingest", "relay", "worker", "runner"):
            procs.wait_http(name, f"http://127.0.0.1:{ports[name]}/metrics")

        send_task(
            producer,
            "acme",
            {
                "goal": "say hi through the echo tool",
                "allowed_tools": ["echo"],
                "sampling": {"max_tokens": 8, "temperature": 0},
            },
            idempotency_key="trace-e2e",
            topic=kafka_settings.tasks_topic,
            traceparent=f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01",
        ).get(timeout=10)

        from sqlalchemy import select

        from orchestrator.store import tasks_t

        end = time.monotonic() + 180
        task = None
        while time.monotonic() < end:
            with db.connect() as conn:
                row = conn.execute(
                    select(tasks_t.c.id).where(tasks_t.c.idempotency_key == "trace-e2e")
                ).first()
                task = get_task(conn, row.id) if row else None
            if task is not None and task.status in ("SUCCEEDED", "FAILED"):
                break
            time.sleep(0.2)
        assert task is not None and task.status == "SUCCEEDED", (task, procs.log("runner")[-3000:])
        assert proxy.calls == 2  # a tool-call turn, then the model's answer

    services = {"dayzero-ingest", "dayzero-runner", "dayzero-worker", "dayzero-inference", "dayzero-relay"}

    def complete() -> bool:
        got = otlp.of_trace(CLIENT_TRACE)
        names = {s.name for s in got}
        return (
            {s.service for s in got} >= services
            and {"tool.execute", "inference.decode"} <= names
            and any(
                s.name.endswith(" publish") and s.attributes.get("dayzero.event_type") == "task.succeeded"
                for s in got
            )
        )

    otlp.wait_for(complete, 60, "the spans of every process")
    spans = otlp.of_trace(CLIENT_TRACE)
    # One trace: every span any process made for this task carries the producer's trace id.
    assert not [
        s for s in otlp.spans if s.attributes.get("dayzero.task_id") == task.id and s.trace_id != CLIENT_TRACE
    ]
    by_id = {s.span_id: s for s in spans}

    def parent(s: ReceivedSpan) -> ReceivedSpan:
        return by_id[s.parent_id]

    def one(name: str, service: str, **attrs) -> ReceivedSpan:
        found = [
            s
            for s in spans
            if s.name == name
            and s.service == service
            and all(s.attributes.get(k) == v for k, v in attrs.items())
        ]
        assert len(found) == 1, (name, service, attrs, [(s.name, s.service) for s in spans])
        return found[0]

    ingest = one(f"{kafka_settings.tasks_topic} process", "dayzero-ingest")
    assert ingest.parent_id == CLIENT_SPAN and ingest.kind == 5  # consumer, below the producer's span
    assert ingest.attributes["dayzero.task_id"] == task.id

    steps = sorted((s for s in spans if s.name in ("step.model", "step.tool")), key=lambda s: s.start_ns)
    assert [s.name for s in steps] == ["step.model", "step.tool", "step.model"]
    assert all(s.service == "dayzero-runner" and s.parent_id == ingest.span_id for s in steps)

    # model steps: runner GenAI client span -> inference server request -> engine phases
    chats = [s for s in spans if s.name == f"chat {MODEL}"]
    assert sorted(parent(c).span_id for c in chats) == sorted(
        s.span_id for s in steps if s.name == "step.model"
    )
    for c in chats:
        assert c.kind == 3 and c.attributes["gen_ai.request.model"] == MODEL
        assert c.attributes["gen_ai.usage.input_tokens"] > 0
    requests = [s for s in spans if s.name == "inference.request"]
    assert len(requests) == 2 and all(r.service == "dayzero-inference" for r in requests)
    for r in requests:
        up = r
        while up.parent_id in by_id and by_id[up.parent_id].service == "dayzero-inference":
            up = by_id[up.parent_id]  # FastAPI's HTTP server span, when it makes one
        assert parent(up).name == f"chat {MODEL}"
        kids = {s.name for s in spans if s.parent_id == r.span_id}
        assert {"inference.queue_wait", "inference.prefill", "inference.decode"} <= kids
    assert chats[0].attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)

    # the tool step: runner publish -> worker consumer (Celery headers) -> the tool's execution
    tool_step = steps[1]
    publish = one("dayzero.run_tool publish", "dayzero-runner")
    assert publish.parent_id == tool_step.span_id and publish.kind == 4
    consume = one("dayzero.run_tool process", "dayzero-worker")
    assert consume.parent_id == publish.span_id and consume.kind == 5
    execute = one("tool.execute", "dayzero-worker")
    assert execute.parent_id == consume.span_id
    assert execute.attributes["dayzero.tool"] == "echo" and execute.attributes["dayzero.attempt"] == 1
    assert tool_step.attributes["dayzero.tool.outcome"] == "ok"

    # state transitions, and the relay's publishes, are spans of the same trace
    moves = {
        (s.attributes["dayzero.from"], s.attributes["dayzero.to"])
        for s in spans
        if s.name == "task.transition"
    }
    assert {("READY", "RUNNING"), ("RUNNING", "SUCCEEDED")} <= moves
    published = [s for s in spans if s.service == "dayzero-relay"]
    assert published and all(parent(s) is ingest for s in published)
    results = consume_all(kafka_broker.bootstrap, kafka_settings.results_topic, 1)
    assert len(results) == 1
    headers = dict(results[0].headers)
    assert headers["traceparent"].decode().split("-")[1] == CLIENT_TRACE

    # every process's /metrics, with the labels the dashboards use (the exposition sorts label names)
    m = {n: _metrics(f"http://127.0.0.1:{p}/metrics") for n, p in ports.items()}
    assert _value(m["ingest"], 'dayzero_ingest_messages_total{outcome="created"}') == 1
    assert _value(m["runner"], 'dayzero_step_duration_seconds_count{kind="model",outcome="succeeded"}') == 2
    assert _value(m["runner"], 'dayzero_tool_attempts_total{outcome="ok",tool="echo"}') == 1
    assert _value(m["runner"], 'dayzero_model_tokens_total{type="prompt"}') > 0
    assert _value(m["runner"], 'dayzero_tasks_finished_total{status="SUCCEEDED"}') == 1
    assert _value(m["worker"], 'dayzero_worker_jobs_total{job="tool",outcome="ok"}') == 1
    assert _value(m["worker"], 'dayzero_worker_job_duration_seconds_count{job="tool"}') == 1
    assert _value(m["worker"], 'dayzero_celery_queue_depth{queue="tools"}') == 0
    assert _value(m["inference"], 'dayzero_inference_requests_total{outcome="ok"}') == 2
    assert _value(m["inference"], "dayzero_inference_time_to_first_token_seconds_count") == 2
    assert _value(m["inference"], 'dayzero_inference_cache_usage_ratio{pool="kv",tier="device"}') >= 0
    assert _value(m["relay"], f'dayzero_relay_published_total{{topic="{kafka_settings.results_topic}"}}') == 1
    assert json.loads(results[0].value)["status"] == "SUCCEEDED"

"""The chart, run: every component started with the args and environment the chart renders
(ConfigMap and Secret resolved as the kubelet resolves them, Service names as cluster DNS would),
on a real PostgreSQL database, Redis broker and Kafka-protocol broker, with the inference server
on CPU with random weights; probed the way the kubelet probes them (the rendered httpGet path and
named port, the rendered exec command); then NOTES.txt's first task: an API key, a submitted
task, a model step answered by the in-chart server.

As in the pods, each process sees a read-only root file system with only /tmp writable (the
chart's emptyDir; the shared data folder lives under it here): a private mount namespace in which
`/` is remounted read-only."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from testing.kafka_broker import free_port, kafka_broker  # noqa: F401 (fixture)
from tests.helm.chart import KAFKA, PREFIX, container, merged, render

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("DAYZERO_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
# Both worker Deployments share one probe template (tests/helm/test_chart.py): one is started.
COMPONENTS = ("inference", "api", "runner", "relay", "ingest", "worker-tools")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED", "TIMED_OUT"}


def _read_only_root(cmd: list[str]) -> list[str]:
    """`cmd` in a mount namespace of its own whose root file system is read-only but for /tmp."""
    remount = 'mount --bind /tmp /tmp && mount -o remount,bind,ro / && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", remount, "sh", *cmd]


def _env(docs: dict, c: dict[str, Any], pod_name: str) -> dict[str, str]:
    """The container's environment as the kubelet builds it from the rendered objects."""
    # PATH/PYTHONPATH stand in for the image's; HOME and no bytecode files as the Dockerfile sets.
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(REPO),
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    for src in c.get("envFrom", []):
        env.update(docs[("ConfigMap", src["configMapRef"]["name"])]["data"])
    for e in c.get("env", []):
        ref = e.get("valueFrom", {})
        if "secretKeyRef" in ref:
            data = docs[("Secret", ref["secretKeyRef"]["name"])]["stringData"]
            if ref["secretKeyRef"]["key"] in data:
                env[e["name"]] = data[ref["secretKeyRef"]["key"]]
            elif not ref["secretKeyRef"].get("optional"):
                raise AssertionError(f"missing Secret key {ref['secretKeyRef']['key']}")
        elif "fieldRef" in ref:
            assert ref["fieldRef"]["fieldPath"] == "metadata.name"
            env[e["name"]] = pod_name
        else:
            env[e["name"]] = e["value"]
    # Cluster DNS: a Service's name reaches its pods; here they all listen on the loopback.
    services = [n for k, n in docs if k == "Service"]
    for k, v in env.items():
        for svc in services:
            v = v.replace(f"http://{svc}:", "http://127.0.0.1:")
        env[k] = v
    return env


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def _port(c: dict[str, Any], name: str) -> int:
    return next(p["containerPort"] for p in c["ports"] if p["name"] == name)


def _probe(c: dict[str, Any], kind: str, env: dict[str, str]) -> bool:
    """One probe attempt, judged as the kubelet judges it."""
    probe = c[kind]
    timeout = probe.get("timeoutSeconds", 1)
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        port = _port(c, port) if isinstance(port, str) else port
        try:
            r = httpx.get(f"http://127.0.0.1:{port}{probe['httpGet']['path']}", timeout=timeout)
        except httpx.HTTPError:
            return False
        return 200 <= r.status_code < 400
    cmd = _read_only_root(probe["exec"]["command"])
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, timeout=timeout, cwd=REPO)
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


@dataclass
class Pod:
    container: dict[str, Any]
    env: dict[str, str]
    proc: subprocess.Popen
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def wait_started(self, timeout_s: float = 120) -> None:
        end = time.monotonic() + timeout_s
        while time.monotonic() < end and self.proc.poll() is None:
            if "startupProbe" not in self.container or _probe(self.container, "startupProbe", self.env):
                return
            time.sleep(0.5)
        raise AssertionError(f"{self.container['name']}: did not start\n{self.tail()}")


@pytest.fixture
def rendered(pg_url, kafka_broker, tmp_path) -> dict:  # noqa: F811 (fixture)
    values = merged(
        KAFKA,
        {
            "kafka": {"bootstrapServers": kafka_broker.bootstrap},
            "database": {"url": pg_url},
            "celery": {"brokerUrl": REDIS_URL},
            "storage": {"mountPath": str(tmp_path / "data")},
            "api": {"port": free_port()},
            "relay": {"metricsPort": free_port()},
            "runner": {"metricsPort": free_port()},
            "ingest": {"metricsPort": free_port()},
            "inference": {
                "enabled": True, "gpus": 0, "port": free_port(), "maxModelLen": 4096,
                "model": {"source": "dummy"},
            },
            # Probe timeouts sized for a shared 2-core test machine, not a node.
            "workers": {"probe": {"timeoutSeconds": 30}},
        },
    )  # fmt: skip
    return render(values)


def _run(cmd: list[str], env: dict[str, str]) -> str:
    done = subprocess.run(
        _read_only_root(cmd), env=env, cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture
def pods(rendered, tmp_path) -> Iterator[dict[str, Pod]]:
    job = container(next(d for (k, _), d in rendered.items() if k == "Job"))
    _run([sys.executable, "-m", "orchestrator.cli", *job["args"]], _env(rendered, job, "migrate"))
    out: dict[str, Pod] = {}
    try:
        for comp in COMPONENTS:
            c = container(rendered[("Deployment", f"{PREFIX}-{comp}")])
            env = _env(rendered, c, f"{comp}-{os.getpid()}-{time.monotonic_ns() % 10**6}")
            log = tmp_path / f"{comp}.log"
            proc = subprocess.Popen(
                _read_only_root([sys.executable, "-m", "orchestrator.cli", *_expand(c["args"], env)]),
                env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            out[comp] = Pod(c, env, proc, log)
        for pod in out.values():
            pod.wait_started()
        yield out
    finally:
        for pod in out.values():
            if pod.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pod.proc.pid, signal.SIGTERM)
        for pod in out.values():
            try:
                pod.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(pod.proc.pid, signal.SIGKILL)
                pod.proc.wait(timeout=10)


def test_the_processes_see_a_read_only_root(tmp_path):
    def rc(shell: str) -> int:
        return subprocess.run(
            _read_only_root(["sh", "-c", shell]), capture_output=True, timeout=30
        ).returncode

    # the root of the file system itself (the checkout may lie under /tmp, as CI's clone can)
    probe = Path("/.dayzero-read-only-check")
    assert rc(f"touch {probe}") != 0
    assert not probe.exists()
    assert rc(f"touch {tmp_path}/writable") == 0


def test_install_probes_and_first_task(pods):
    for comp, pod in pods.items():
        assert pod.proc.poll() is None, f"{comp} exited\n{pod.tail()}"
        for kind in ("readinessProbe", "livenessProbe"):
            assert _probe(pod.container, kind, pod.env), (comp, kind, pod.tail())
    # The worker probe is about this worker: another node name (a pod whose worker died while a
    # sibling lives) fails it.
    tools = pods["worker-tools"]
    assert not _probe(tools.container, "livenessProbe", {**tools.env, "POD_NAME": "not-this-pod"})

    # NOTES.txt: an API key from the API pod, a task through the API Service.
    api = pods["api"]
    key = _run(
        [sys.executable, "-m", "orchestrator.cli", "apikey", "create", "--tenant", "demo"], api.env
    ).strip()
    base = f"http://127.0.0.1:{_port(api.container, 'http')}"
    headers = {"Authorization": f"Bearer {key}"}
    body = {
        "goal": "Say hello.",
        "allowed_tools": [],
        "budget": {"max_steps": 1},
        "sampling": {"max_tokens": 8},
    }
    r = httpx.post(f"{base}/v1/tasks", json=body, headers=headers, timeout=30)
    assert r.status_code == 201, r.text
    task_id = r.json()["id"]
    end = time.monotonic() + 120
    task: dict[str, Any] = {}
    while time.monotonic() < end:
        task = httpx.get(f"{base}/v1/tasks/{task_id}", headers=headers, timeout=30).json()
        if task["status"] in TERMINAL:
            break
        time.sleep(0.5)
    assert task.get("status") in TERMINAL, (task, pods["runner"].tail())
    # The runner reached the in-chart server through its Service URL and got tokens back.
    assert task["usage"]["prompt_tokens"] > 0 and task["usage"]["completion_tokens"] > 0, task
    assert 'POST /v1/chat/completions HTTP/1.1" 200' in pods["inference"].log.read_text(errors="replace")

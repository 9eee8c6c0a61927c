"""The chart's commands and probes against the real processes. Each component is started with the
args and environment the chart renders (ConfigMap + Secret resolved as the kubelet would) on a
real PostgreSQL database, Redis broker and Kafka-protocol broker, then probed the way the kubelet
probes it: the rendered httpGet path and named port, the rendered exec command. As in the pod,
each process sees a read-only root file system with only /tmp (the chart's emptyDir; the shared
data folder lives under it here) writable: a private mount namespace, where `/` is remounted
read-only."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helm.chart import KAFKA, PREFIX, container, merged, render
from tests.support.kafka_broker import free_port, kafka_broker  # noqa: F401 (fixture)

pytestmark = pytest.mark.postgres

REPO = Path(__file__).resolve().parents[2]
REDIS_URL = os.environ.get("DAYZERO_TEST_REDIS_URL", "redis://127.0.0.1:6379/13")
# Both worker Deployments share one probe template (tests/helm/test_chart.py): one is started.
COMPONENTS = ("api", "relay", "ingest", "worker-tools")


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
    return env


def _expand(args: list[str], env: dict[str, str]) -> list[str]:
    """Kubernetes' $(VAR) expansion of container args."""
    return [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in args]


def _probe(c: dict[str, Any], kind: str, env: dict[str, str]) -> bool:
    """One probe attempt, judged as the kubelet judges it."""
    probe = c[kind]
    timeout = probe.get("timeoutSeconds", 1)
    if "httpGet" in probe:
        port = probe["httpGet"]["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in c["ports"] if p["name"] == port)
        try:
            r = httpx.get(f"http://127.0.0.1:{port}{probe['httpGet']['path']}", timeout=timeout)
        except httpx.HTTPError:
            return False
        return 200 <= r.status_code < 400
    try:
        done = subprocess.run(
            _read_only_root(probe["exec"]["command"]), env=env, capture_output=True, timeout=timeout, cwd=REPO
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def _wait_started(proc: subprocess.Popen, c: dict, env: dict, log: Path, timeout_s: float = 90) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            break
        if _probe(c, "startupProbe", env):
            return
        time.sleep(0.5)
    raise AssertionError(
        f"{c['name']}: startup probe never passed\n{log.read_text(errors='replace')[-3000:]}"
    )


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
            "ingest": {"metricsPort": free_port()},
            # Probe timeouts sized for a shared 2-core test machine, not a node.
            "workers": {"probe": {"timeoutSeconds": 30}},
        },
    )
    return render(values)


@pytest.fixture
def started(rendered, tmp_path) -> Iterator[dict[str, tuple[dict, dict[str, str]]]]:
    job = container(next(d for (k, _), d in rendered.items() if k == "Job"))
    job_env = _env(rendered, job, "migrate")
    subprocess.run(
        _read_only_root([sys.executable, "-m", "orchestrator.cli", *job["args"]]),
        env=job_env,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    procs: list[subprocess.Popen] = []
    out: dict[str, tuple[dict, dict[str, str], subprocess.Popen, Path]] = {}
    try:
        for comp in COMPONENTS:
            c = container(rendered[("Deployment", f"{PREFIX}-{comp}")])
            pod = f"{comp}-{os.getpid()}-{time.monotonic_ns() % 10**6}"
            env = _env(rendered, c, pod)
            log = tmp_path / f"{comp}.log"
            proc = subprocess.Popen(
                _read_only_root([sys.executable, "-m", "orchestrator.cli", *_expand(c["args"], env)]),
                env=env, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
            procs.append(proc)
            out[comp] = (c, env, proc, log)
        for c, env, proc, log in out.values():
            _wait_started(proc, c, env, log)
        yield {k: (c, env) for k, (c, env, _, _) in out.items()}
    finally:
        for proc in procs:
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def test_the_processes_see_a_read_only_root(tmp_path):
    def rc(shell: str) -> int:
        return subprocess.run(
            _read_only_root(["sh", "-c", shell]), capture_output=True, timeout=30
        ).returncode

    assert rc(f"touch {REPO}/.read-only-check") != 0
    assert not (REPO / ".read-only-check").exists()
    assert rc(f"touch {tmp_path}/writable") == 0


def test_every_probed_component_starts_and_passes_its_probes(started):
    for comp, (c, env) in started.items():
        for kind in ("readinessProbe", "livenessProbe"):
            assert _probe(c, kind, env), (comp, kind)
    # The worker probe is about this worker: another node name (a pod whose worker died while a
    # sibling lives) fails it.
    c, env = started["worker-tools"]
    assert not _probe(c, "livenessProbe", {**env, "POD_NAME": "not-this-pod"})

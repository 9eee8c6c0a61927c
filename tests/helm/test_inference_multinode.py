"""The multi-node inference recipe: a StatefulSet of one pod per host, a headless Service for the
rendezvous, pod 0 the driver behind the API Service; every pod's command parses with the real CLI
and resolves to its place in the cluster from the environment the chart gives it."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from inference.parallel.cluster import ClusterSpec, cluster_from_args
from orchestrator.cli import build_parser
from testing.ports import free_port_pair
from tests.helm.chart import GPU_INFERENCE, PREFIX, container, env_of, merged, pod_spec, render
from tests.helm.test_kubernetes_schemas import validate

REPO = Path(__file__).resolve().parents[2]
NAME = f"{PREFIX}-inference-multinode"
RDZV = f"{NAME}-rdzv"
MULTINODE = merged(
    GPU_INFERENCE,
    {
        "inferenceMultinode": {
            "enabled": True,
            "nodes": 4,
            "tensorParallelSize": 8,
            "expertParallelSize": 1,
            "pipelineParallelSize": 4,
        }
    },
)


def test_statefulset_one_pod_per_host_with_a_headless_rendezvous_service():
    docs = render(MULTINODE)
    for doc in docs.values():
        validate(doc)  # the Kubernetes API's own schemas, strict
    sts = docs[("StatefulSet", NAME)]
    spec, pod = sts["spec"], pod_spec(sts)
    assert spec["replicas"] == 4 and spec["serviceName"] == RDZV
    assert spec["podManagementPolicy"] == "Parallel"  # the ranks meet at start-up: start together
    anti = pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["topologyKey"] == "kubernetes.io/hostname"
    c = container(sts)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 8  # TP 8 x EP 1 x PP 4 over 4 hosts
    # every pod answers /health on its http port: pod 0 the engine's, the others their launcher's
    assert c["args"][:3] == ["infer-node", "--health-port", "8000"]
    for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
        assert c[probe]["httpGet"] == {"path": "/health", "port": "http"}
    assert c["image"].endswith("-gpu")
    headless = docs[("Service", RDZV)]["spec"]
    assert headless["clusterIP"] == "None" and headless["publishNotReadyAddresses"] is True
    assert {p["port"] for p in headless["ports"]} == {29500, 29501}
    api = docs[("Service", NAME)]["spec"]
    assert api["selector"]["statefulset.kubernetes.io/pod-name"] == f"{NAME}-0"  # the driver
    env = env_of(c)
    assert (
        env["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.labels['apps.kubernetes.io/pod-index']"
    )
    assert env["MASTER_ADDR"]["value"] == f"{NAME}-0.{RDZV}.ns.svc"
    assert env["DAYZERO_CLUSTER_KEY"]["valueFrom"]["secretKeyRef"] == {
        "name": NAME,
        "key": "DAYZERO_CLUSTER_KEY",
    }
    assert docs[("Secret", NAME)]["stringData"]["DAYZERO_CLUSTER_KEY"]


def test_network_policy_lets_the_pods_of_the_engine_reach_each_other():
    docs = render(MULTINODE)
    pol = docs[("NetworkPolicy", NAME)]["spec"]
    sel = pol["podSelector"]["matchLabels"]
    assert sel == docs[("StatefulSet", NAME)]["spec"]["selector"]["matchLabels"]
    assert sel["app.kubernetes.io/component"] == "inference-multinode"
    peers, callers = pol["ingress"]
    assert "ports" not in peers and peers["from"] == [{"podSelector": {"matchLabels": sel}}]
    assert callers["ports"] == [{"port": "http", "protocol": "TCP"}]
    assert {f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for f in callers["from"]} == {
        "runner",
        "api",
    }


def test_every_pod_runs_one_command_that_finds_its_place_from_the_environment(monkeypatch):
    c = container(render(MULTINODE)[("StatefulSet", NAME)])
    env = env_of(c)
    parser = build_parser()
    args = parser.parse_args(c["args"])
    assert args.command == "infer-node"
    serve = parser.parse_args(args.driver[1:])  # what node 0 runs after "--"
    assert (serve.tensor_parallel_size, serve.expert_parallel_size, serve.pipeline_parallel_size) == (8, 1, 4)
    assert serve.model == "/models/kimi-linear-48b"
    for key in ("NNODES", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(key, env[key]["value"])
    for pod in range(4):
        monkeypatch.setenv("NODE_RANK", str(pod))  # what the pod-index label gives pod `pod`
        want = ClusterSpec(4, pod, f"{NAME}-0.{RDZV}.ns.svc", 29500)
        assert cluster_from_args(args) == want == cluster_from_args(serve)


def test_a_world_that_does_not_split_over_the_nodes_is_refused():
    import helm_python

    with pytest.raises(helm_python.HelmError, match="must split evenly over 3 nodes"):
        render(merged(MULTINODE, {"inferenceMultinode": {"nodes": 3}}))
    with pytest.raises(helm_python.HelmError):  # the values schema: unknown settings are errors
        render(merged(MULTINODE, {"inferenceMultinode": {"gpus": 8}}))


def test_off_by_default():
    assert not [k for k in render(merged()) if k[1].startswith(NAME)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(port: int, path: str = "/health") -> int | None:
    try:
        return httpx.get(f"http://127.0.0.1:{port}{path}", timeout=5).status_code
    except httpx.HTTPError:
        return None


def _pod_env(docs: dict, c: dict, index: int) -> dict[str, str]:
    """Pod `index`'s environment as the kubelet builds it; the pods' DNS names reach the loopback."""
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(REPO), "HOME": "/tmp"}
    for src in c.get("envFrom", []):
        env.update(docs[("ConfigMap", src["configMapRef"]["name"])]["data"])
    for e in c["env"]:
        ref = e.get("valueFrom", {})
        if "secretKeyRef" in ref:
            env[e["name"]] = docs[("Secret", ref["secretKeyRef"]["name"])]["stringData"][
                ref["secretKeyRef"]["key"]
            ]
        elif "fieldRef" in ref:
            path = ref["fieldRef"]["fieldPath"]
            env[e["name"]] = {"metadata.name": f"{NAME}-{index}"}.get(path) or {
                "metadata.labels['apps.kubernetes.io/pod-index']": str(index)
            }[path]
        else:
            env[e["name"]] = e["value"]
    assert env["MASTER_ADDR"] == f"{NAME}-0.{RDZV}.ns.svc"
    env["MASTER_ADDR"] = "127.0.0.1"
    return env


def test_the_rendered_pods_run_one_engine_over_two_nodes(tmp_path):
    """Two pods of the rendered StatefulSet (CPU ranks, random weights) started on 127.0.0.1 with
    the commands and environment the chart gives them: pod 0 serves completions from an engine
    whose second pipeline stage runs in pod 1; both probes answer; when pod 1 goes, the engine
    stops and pod 0's liveness probe says so."""
    http, rdzv = _free_port(), free_port_pair()  # the driver listens on rdzv and rdzv + 1
    values = merged(
        {
            "inference": {
                "gpus": 0,
                "port": http,
                "maxModelLen": 256,
                "model": {"source": "dummy", "dummyConfig": "inference/configs/tiny_deepseek_v32.json"},
            },
            "inferenceApiKey": "test-key",
            "inferenceMultinode": {
                "enabled": True, "nodes": 2, "tensorParallelSize": 1, "pipelineParallelSize": 2,
                "rendezvousPort": rdzv, "extraArgs": ["--num-blocks", "64"],
            },
        }
    )  # fmt: skip
    docs = render(values)
    c = container(docs[("StatefulSet", NAME)])
    assert (
        c["args"][c["args"].index("--device") + 1] == "cpu"
        and "nvidia.com/gpu" not in c["resources"]["limits"]
    )
    procs = []
    health1 = _free_port()  # one host here: pod 1's launcher answers on a port of its own
    try:
        for index in (1, 0):
            args = list(c["args"])
            if index == 1:
                args[args.index("--health-port") + 1] = str(health1)
            log = (tmp_path / f"pod{index}.log").open("w")
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "orchestrator.cli", *args], env=_pod_env(docs, c, index),
                    cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                )
            )  # fmt: skip
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and (_status(http) != 200 or _status(health1) != 200):
            assert all(p.poll() is None for p in procs), (tmp_path / "pod0.log").read_text()[-3000:]
            time.sleep(1)
        assert _status(http) == 200 and _status(health1) == 200
        r = httpx.post(
            f"http://127.0.0.1:{http}/v1/completions",
            json={"model": "dayzero-small", "prompt": "hello", "max_tokens": 4, "temperature": 0},
            headers={"Authorization": "Bearer test-key"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 4
        os.killpg(procs[0].pid, signal.SIGKILL)  # pod 1: its launcher and its rank
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and _status(http) == 200:
            httpx.post(  # a request makes the engine meet the lost stage at once
                f"http://127.0.0.1:{http}/v1/completions",
                json={"model": "dayzero-small", "prompt": "again", "max_tokens": 2},
                headers={"Authorization": "Bearer test-key"},
                timeout=60,
            )
            time.sleep(1)
        assert _status(http) == 503  # the liveness probe restarts pod 0
        assert "rank 1" in (tmp_path / "pod0.log").read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

"""The multi-node inference recipe: a StatefulSet of one pod per host, a headless Service for the
rendezvous, pod 0 the driver behind the API Service; every pod's command parses with the real CLI
and resolves to its place in the cluster from the environment the chart gives it."""

from __future__ import annotations

import pytest

from inference.parallel.cluster import ClusterSpec, cluster_from_args
from orchestrator.cli import build_parser
from tests.helm.chart import GPU_INFERENCE, PREFIX, container, env_of, merged, pod_spec, render
from tests.helm.test_kubernetes_schemas import validate

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

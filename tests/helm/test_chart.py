"""The chart's wiring: what each component runs with (args, env, probes, volumes, GPU limits, hooks,
autoscaling targets) and the hardening of issue 15 (security contexts, NetworkPolicies, Secrets)."""

from __future__ import annotations

import pytest

from orchestrator.cli import build_parser
from tests.helm.chart import (
    EXISTING_SECRET,
    GPU_INFERENCE,
    KAFKA,
    KEDA_RABBITMQ,
    KEDA_REDIS,
    PREFIX,
    PRODUCTION,
    VALUE_SETS,
    container,
    env_of,
    merged,
    pod_spec,
    render,
    workloads,
)

CPU_IMAGE = "ghcr.io/dayzero/dayzero:0.1.0"


def _deploy(docs, component: str) -> dict:
    return docs[("Deployment", f"{PREFIX}-{component}")]


def test_default_render_has_every_component():
    docs = render(merged())
    assert {n for k, n in docs if k == "Deployment"} == {
        f"{PREFIX}-{c}" for c in ("api", "runner", "worker-preprocess", "worker-tools")
    }
    assert container(_deploy(docs, "runner"))["args"] == ["runner", "--metrics-port", "9090"]
    pre = container(_deploy(docs, "worker-preprocess"))
    assert pre["args"] == [
        "worker",
        "--queues",
        "preprocess",
        "--concurrency",
        "2",
        "--hostname",
        "celery@$(POD_NAME)",
    ]
    secret = docs[("Secret", f"{PREFIX}-secrets")]
    assert secret["stringData"]["CELERY_RESULT_BACKEND"] == "redis://redis:6379/0"
    # No model server in the chart and none configured: no key is generated or handed out.
    assert "DAYZERO_INFERENCE_API_KEY" not in secret["stringData"]
    assert "DAYZERO_INFERENCE_API_KEY" not in env_of(container(_deploy(docs, "runner")))
    cfg = docs[("ConfigMap", f"{PREFIX}-config")]["data"]
    assert "KAFKA_BOOTSTRAP_SERVERS" not in cfg
    assert cfg["DAYZERO_BUDGET_MAX_TOKENS"] == "1000000"  # an integer, not 1e+06
    assert cfg["DAYZERO_BLOB_DIR"] == "/var/lib/dayzero/blobs"


def test_migrations_run_as_a_hook_before_install_and_upgrades():
    docs = render(merged())
    job = docs[("Job", f"{PREFIX}-migrate-1")]
    ann = job["metadata"]["annotations"]
    assert ann["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert ann["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    assert container(job)["args"] == ["db", "upgrade"]
    # It runs before the release's objects exist: only the Secret, itself an earlier hook.
    assert set(env_of(container(job))) == {"DATABASE_URL"}
    assert "envFrom" not in container(job)
    assert "serviceAccountName" not in pod_spec(job)
    assert pod_spec(job)["automountServiceAccountToken"] is False
    secret = docs[("Secret", f"{PREFIX}-secrets")]["metadata"]["annotations"]
    assert secret["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(secret["helm.sh/hook-weight"]) < int(ann["helm.sh/hook-weight"])
    assert secret["helm.sh/hook-delete-policy"] == "before-hook-creation"  # never while pods use it
    mine = render(merged(EXISTING_SECRET))
    ref = env_of(container(mine[("Job", f"{PREFIX}-migrate-1")]))["DATABASE_URL"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == "dz-creds"


def test_every_container_runs_a_real_dayzero_command():
    """Each container's args parse with the real CLI: a flag the code does not know fails here,
    not in a crash-looping pod."""
    parser = build_parser()
    for name, values in VALUE_SETS.items():
        if name == "tensor-parallel-image-volume":
            continue  # --tensor-parallel-size: see test_tensor_parallel_and_image_volume
        for wname, w in workloads(render(values)).items():
            try:
                parser.parse_args(container(w)["args"])
            except SystemExit:
                pytest.fail(f"{name}: {wname} runs {container(w)['args']}, which dayzero does not accept")


def test_probes_on_every_workload():
    docs = render(PRODUCTION)
    for name, w in workloads(docs).items():
        c = container(w)
        if w["kind"] == "Job":
            assert not {"livenessProbe", "readinessProbe", "startupProbe"} & set(c), name
            continue
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            assert probe in c, (name, probe)
    api = container(_deploy(docs, "api"))
    assert api["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert api["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    for comp in ("ingest", "relay"):
        c = container(_deploy(docs, comp))
        assert c["livenessProbe"]["httpGet"] == {"path": "/metrics", "port": "metrics"}
        assert c["args"][c["args"].index("--metrics-port") + 1] == "9090"
        assert c["ports"] == [{"name": "metrics", "containerPort": 9090}]
    runner = container(_deploy(docs, "runner"))
    assert runner["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert runner["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    for comp in ("worker-preprocess", "worker-tools"):
        cmd = container(_deploy(docs, comp))["livenessProbe"]["exec"]["command"]
        assert cmd[:2] == ["sh", "-c"]
        assert 'inspect ping --destination "celery@$POD_NAME"' in cmd[2]


def test_worker_probe_pings_the_node_the_worker_runs_as():
    """The probe's destination is the --hostname the worker starts with (POD_NAME expanded)."""
    c = container(_deploy(render(merged()), "worker-tools"))
    hostname = c["args"][c["args"].index("--hostname") + 1]
    assert hostname.replace("$(POD_NAME)", "$POD_NAME") in c["livenessProbe"]["exec"]["command"][2]
    assert env_of(c)["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"


def test_gpu_inference_server():
    docs = render(merged(GPU_INFERENCE))
    inf = _deploy(docs, "inference")
    c, spec = container(inf), pod_spec(inf)
    assert c["image"] == CPU_IMAGE + "-gpu"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    args = c["args"]
    assert args[:4] == ["infer", "serve", "--model", "/models/kimi-linear-48b"]
    assert args[args.index("--device") + 1] == "cuda"
    assert args[args.index("--served-model-name") + 1] == "dayzero-small"  # what the runners ask for
    assert "--tensor-parallel-size" not in args
    # Startup waits for the weights (the server listens only once they are loaded), then /health.
    assert c["startupProbe"]["httpGet"]["path"] == "/health"
    assert c["startupProbe"]["periodSeconds"] * c["startupProbe"]["failureThreshold"] == 1800
    assert c["readinessProbe"]["httpGet"]["path"] == "/health"
    vols = {v["name"]: v for v in spec["volumes"]}
    assert vols["model"]["persistentVolumeClaim"] == {"claimName": "kimi", "readOnly": True}
    assert vols["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "16Gi"}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    assert mounts["model"] == {"name": "model", "mountPath": "/models", "readOnly": True}
    assert mounts["dshm"]["mountPath"] == "/dev/shm"
    assert spec["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    anti = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
    assert anti["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert (
        anti["podAffinityTerm"]["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "inference"
    )
    # A rollout never needs a spare GPU: the old pod goes first.
    assert inf["spec"]["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    # The server holds no database or broker credentials, only its API key.
    assert set(env_of(c)) == {"DAYZERO_INFERENCE_API_KEY", "POD_NAME"}
    cfg = docs[("ConfigMap", f"{PREFIX}-config")]["data"]
    assert cfg["DAYZERO_INFERENCE_URL"] == f"http://{PREFIX}-inference:8000"
    hard = pod_spec(_deploy(render(PRODUCTION), "inference"))["affinity"]["podAntiAffinity"]
    assert set(hard) == {"requiredDuringSchedulingIgnoredDuringExecution"}


def test_tensor_parallel_and_image_volume():
    docs = render(VALUE_SETS["tensor-parallel-image-volume"])
    c = container(_deploy(docs, "inference"))
    assert c["args"][c["args"].index("--tensor-parallel-size") + 1] == "4"
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 4
    vols = {v["name"]: v for v in pod_spec(_deploy(docs, "inference"))["volumes"]}
    assert vols["model"]["image"] == {
        "reference": "registry.example/kimi-weights:1",
        "pullPolicy": "IfNotPresent",
    }


def test_fewer_gpus_than_tensor_parallel_ranks_is_refused():
    import helm_python

    with pytest.raises(helm_python.HelmError, match=r"inference.gpus \(2\) must be at least"):
        render(merged(GPU_INFERENCE, {"inference": {"tensorParallelSize": 4}}))


def test_cpu_inference_runs_the_cpu_image_without_gpus():
    c = container(_deploy(render(VALUE_SETS["cpu-dummy-inference"]), "inference"))
    assert c["image"] == CPU_IMAGE
    assert "nvidia.com/gpu" not in c["resources"].get("limits", {})
    assert c["args"][2:4] == ["--dummy", "inference/configs/tiny_hybrid_vl.json"]
    assert c["args"][c["args"].index("--device") + 1] == "cpu"


def test_inference_api_key_is_generated_and_wired_to_server_and_callers():
    docs = render(merged(GPU_INFERENCE))
    key = docs[("Secret", f"{PREFIX}-secrets")]["stringData"]["DAYZERO_INFERENCE_API_KEY"]
    assert len(key) == 48 and key.isalnum()
    assert (
        render(merged(GPU_INFERENCE))[("Secret", f"{PREFIX}-secrets")]["stringData"][
            "DAYZERO_INFERENCE_API_KEY"
        ]
        != key
    )  # random per fresh install (upgrades reuse the live Secret's key via lookup)
    for comp in ("inference", "runner", "api"):
        ref = env_of(container(_deploy(docs, comp)))["DAYZERO_INFERENCE_API_KEY"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": f"{PREFIX}-secrets", "key": "DAYZERO_INFERENCE_API_KEY"}, comp
    for comp in ("worker-preprocess", "worker-tools"):
        assert "DAYZERO_INFERENCE_API_KEY" not in env_of(container(_deploy(docs, comp))), comp


def test_external_endpoint_key_goes_through_the_secret():
    docs = render(merged({"inferenceUrl": "http://vllm:8000", "inferenceApiKey": "sk-external"}))
    assert docs[("Secret", f"{PREFIX}-secrets")]["stringData"]["DAYZERO_INFERENCE_API_KEY"] == "sk-external"
    assert "DAYZERO_INFERENCE_API_KEY" in env_of(container(_deploy(docs, "runner")))
    assert docs[("ConfigMap", f"{PREFIX}-config")]["data"]["DAYZERO_INFERENCE_URL"] == "http://vllm:8000"


def test_existing_secret_replaces_the_generated_one():
    docs = render(merged(EXISTING_SECRET, GPU_INFERENCE))
    assert not [n for k, n in docs if k == "Secret"]
    for name, w in workloads(docs).items():
        for e in container(w)["env"]:
            if "secretKeyRef" in e.get("valueFrom", {}):
                assert e["valueFrom"]["secretKeyRef"]["name"] == "dz-creds", (name, e["name"])


def test_credentials_only_from_secrets():
    """No URL with a password, and no key, is ever a plain env value or in the ConfigMap."""
    values = merged(GPU_INFERENCE, KAFKA, {"database": {"url": "postgresql+psycopg://u:hunter2@pg/dz"}})
    docs = render(values)
    secret_values = set(docs[("Secret", f"{PREFIX}-secrets")]["stringData"].values())
    for (kind, name), doc in docs.items():
        if kind == "Secret":
            continue
        text = repr(doc)
        for s in secret_values:
            assert s not in text, (kind, name)
        assert "hunter2" not in text


def test_kafka_components_only_with_kafka():
    docs = render(merged(KAFKA))
    assert container(_deploy(docs, "ingest"))["args"][0] == "ingest"
    relay = container(_deploy(docs, "relay"))
    assert relay["args"][0] == "relay"
    assert set(env_of(relay)) == {"DATABASE_URL", "POD_NAME"}
    assert docs[("ConfigMap", f"{PREFIX}-config")]["data"]["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"
    no_create = render(merged(KAFKA, {"kafka": {"createTopics": False}}))
    assert container(_deploy(no_create, "ingest"))["args"][-1] == "--no-create-topics"
    assert ("Deployment", f"{PREFIX}-relay") not in render(merged())  # relay needs Kafka


def test_security_context_of_every_pod_and_container():
    for name, values in VALUE_SETS.items():
        for wname, w in workloads(render(values)).items():
            spec, c = pod_spec(w), container(w)
            assert spec["automountServiceAccountToken"] is False, (name, wname)
            assert spec["securityContext"]["runAsNonRoot"] is True
            assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, (name, wname)
            assert sc["allowPrivilegeEscalation"] is False
            assert sc["capabilities"]["drop"] == ["ALL"]
            tmp = next(m for m in c["volumeMounts"] if m["mountPath"] == "/tmp")
            assert next(v for v in spec["volumes"] if v["name"] == tmp["name"])["emptyDir"]


def test_tools_worker_security_context_override_is_merged():
    cap = {"capabilities": {"add": ["SYS_ADMIN"]}}
    docs = render(merged({"workers": {"tools": {"securityContext": cap}}}))
    sc = container(_deploy(docs, "worker-tools"))["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["SYS_ADMIN"]}
    assert sc["readOnlyRootFilesystem"] is True
    assert "add" not in container(_deploy(docs, "worker-preprocess"))["securityContext"]["capabilities"]


def test_network_policies():
    docs = render(PRODUCTION)
    deny = docs[("NetworkPolicy", f"{PREFIX}-default-deny")]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    assert deny["podSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "dayzero",
        "app.kubernetes.io/instance": "rel",
    }
    inf = docs[("NetworkPolicy", f"{PREFIX}-inference")]["spec"]
    assert inf["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "inference"
    (rule,) = inf["ingress"]
    callers = {p["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for p in rule["from"]}
    assert callers == {"runner", "api"}
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    api = docs[("NetworkPolicy", f"{PREFIX}-api")]["spec"]["ingress"][0]
    assert api["from"] == PRODUCTION["networkPolicy"]["apiFrom"]
    metrics = docs[("NetworkPolicy", f"{PREFIX}-metrics")]["spec"]["ingress"][0]
    assert metrics["from"] == PRODUCTION["networkPolicy"]["metricsFrom"]
    assert not [
        n for k, n in render(VALUE_SETS["policies-off"]) if k in ("NetworkPolicy", "PodDisruptionBudget")
    ]


def test_disruption_budgets_for_every_deployment():
    docs = render(PRODUCTION)
    deployments = {n for k, n in docs if k == "Deployment"}
    pdbs = {n: d for (k, n), d in docs.items() if k == "PodDisruptionBudget"}
    assert set(pdbs) == deployments
    for n, pdb in pdbs.items():
        assert pdb["spec"]["maxUnavailable"] == 1
        assert (
            pdb["spec"]["selector"]["matchLabels"]
            == docs[("Deployment", n)]["spec"]["selector"]["matchLabels"]
        )


def test_cpu_autoscaling_targets():
    docs = render(PRODUCTION)
    for comp in ("api", "runner", "worker-tools"):
        hpa = docs[("HorizontalPodAutoscaler", f"{PREFIX}-{comp}")]["spec"]
        assert hpa["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": f"{PREFIX}-{comp}",
        }
        assert hpa["metrics"][0]["resource"]["target"] == {"type": "Utilization", "averageUtilization": 70}
        assert "replicas" not in _deploy(docs, comp)["spec"]  # the HPA owns the count
    plain = render(merged())
    assert ("HorizontalPodAutoscaler", f"{PREFIX}-worker-preprocess") in plain
    assert _deploy(plain, "api")["spec"]["replicas"] == 2
    off = render(VALUE_SETS["hpa-off"])
    assert ("HorizontalPodAutoscaler", f"{PREFIX}-worker-preprocess") not in off
    assert _deploy(off, "worker-preprocess")["spec"]["replicas"] == 2


def test_queue_depth_autoscaling_with_redis():
    docs = render(merged(KEDA_REDIS))
    name = f"{PREFIX}-worker-preprocess"
    # KEDA owns the HPA while on: a second one on the same Deployment would fight it.
    assert ("HorizontalPodAutoscaler", name) not in docs
    so = docs[("ScaledObject", name)]["spec"]
    assert so["scaleTargetRef"]["name"] == name
    assert (so["minReplicaCount"], so["maxReplicaCount"]) == (1, 32)
    redis, cpu = so["triggers"]
    assert redis["type"] == "redis"
    assert redis["metadata"] == {
        "address": "redis:6379",
        "databaseIndex": "0",
        "listName": "preprocess",
        "listLength": "10",
    }
    assert "authenticationRef" not in redis
    assert cpu == {"type": "cpu", "metricType": "Utilization", "metadata": {"value": "70"}}
    assert ("TriggerAuthentication", name) not in docs
    with_pw = render(
        merged(
            KEDA_REDIS, {"workers": {"preprocess": {"queueScaling": {"redisPasswordKey": "REDIS_PASSWORD"}}}}
        )
    )
    auth = with_pw[("TriggerAuthentication", name)]["spec"]["secretTargetRef"]
    assert auth == [{"parameter": "password", "name": f"{PREFIX}-secrets", "key": "REDIS_PASSWORD"}]
    assert with_pw[("ScaledObject", name)]["spec"]["triggers"][0]["authenticationRef"] == {"name": name}


def test_queue_depth_autoscaling_with_rabbitmq():
    docs = render(merged(KEDA_RABBITMQ))
    name = f"{PREFIX}-worker-preprocess"
    trig = docs[("ScaledObject", name)]["spec"]["triggers"][0]
    assert trig["type"] == "rabbitmq"
    assert trig["metadata"] == {
        "protocol": "amqp",
        "mode": "QueueLength",
        "queueName": "preprocess",
        "value": "10",
    }
    auth = docs[("TriggerAuthentication", name)]["spec"]["secretTargetRef"]
    assert auth == [{"parameter": "host", "name": f"{PREFIX}-secrets", "key": "CELERY_BROKER_URL"}]


def test_service_monitors_select_a_service_with_the_port():
    docs = render(PRODUCTION)
    services = {n: d for (k, n), d in docs.items() if k == "Service"}
    monitors = {n: d for (k, n), d in docs.items() if k == "ServiceMonitor"}
    assert {n.removeprefix(f"{PREFIX}-") for n in monitors} == {"api", "inference", "ingest", "relay"}
    for n, sm in monitors.items():
        assert sm["metadata"]["labels"]["release"] == "prometheus"
        sel = sm["spec"]["selector"]["matchLabels"]
        port = sm["spec"]["endpoints"][0]["port"]
        matching = [s for s in services.values() if sel.items() <= s["metadata"]["labels"].items()]
        assert len(matching) == 1, n
        assert port in {p["name"] for p in matching[0]["spec"]["ports"]}, n


def test_shared_storage_is_mounted_where_files_are_written():
    docs = render(merged({"storage": {"existingClaim": "dz-data"}}))
    for comp in ("api", "runner", "worker-preprocess", "worker-tools"):
        w = _deploy(docs, comp)
        vol = next(v for v in pod_spec(w)["volumes"] if v["name"] == "data")
        assert vol["persistentVolumeClaim"] == {"claimName": "dz-data"}
        assert {"name": "data", "mountPath": "/var/lib/dayzero"} in container(w)["volumeMounts"]
    created = render(VALUE_SETS["created-storage"])
    pvc = created[("PersistentVolumeClaim", f"{PREFIX}-data")]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    url = render(merged({"storage": {"blobUrl": "s3://b/dz"}}))
    assert url[("ConfigMap", f"{PREFIX}-config")]["data"]["DAYZERO_BLOB_DIR"] == "s3://b/dz"
    assert "data" not in {v["name"] for v in pod_spec(_deploy(url, "api"))["volumes"]}


def test_image_digest_wins_over_tag():
    digest = "sha256:" + "a" * 64
    docs = render(merged({"image": {"digest": digest}}))
    assert container(_deploy(docs, "api"))["image"] == f"ghcr.io/dayzero/dayzero@{digest}"


def test_notes_tell_how_to_submit_a_first_task():
    from tests.helm.chart import render_files

    notes = render_files(merged(GPU_INFERENCE))["dayzero/templates/NOTES.txt"]
    assert "dayzero apikey create --tenant demo" in notes
    assert "port-forward svc/rel-dayzero-api 8080:80" in notes
    assert "http://127.0.0.1:8080/v1/tasks" in notes
    assert "http://127.0.0.1:8080/ui/#/tasks/TASK_ID" in notes
    assert "rollout status deploy/rel-dayzero-inference" in notes
    assert "WARNING: no shared storage" in notes

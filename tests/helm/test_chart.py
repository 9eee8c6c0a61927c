"""The Helm chart lints and renders what a platform team expects (Helm's own Go SDK, no cluster)."""

from __future__ import annotations

from pathlib import Path

import helm_python
import pytest
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "dayzero"
REQUIRED = {
    "database": {"url": "postgresql+psycopg://u:p@pg:5432/dz"},
    "celery": {"brokerUrl": "redis://redis:6379/0"},
}


def _render(values: dict) -> dict[tuple[str, str], dict]:
    chart = helm_python.Chart.load(str(CHART))
    try:
        files = chart.render(values, name="rel", namespace="ns", is_install=True)
    finally:
        chart.close()
    docs = {}
    for path, text in files.items():
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                docs[(doc["kind"], doc["metadata"]["name"])] = doc
    return docs


def _container(doc: dict) -> dict:
    return doc["spec"]["template"]["spec"]["containers"][0]


def test_lint_is_clean():
    result = helm_python.lint(str(CHART), REQUIRED, strict=True)
    assert result["errors"] == []


def test_default_render_has_every_component():
    docs = _render(REQUIRED)
    deployments = {name for kind, name in docs if kind == "Deployment"}
    assert deployments == {
        "rel-dayzero-api",
        "rel-dayzero-runner",
        "rel-dayzero-relay",
        "rel-dayzero-worker-preprocess",
        "rel-dayzero-worker-tools",
    }
    assert _container(docs[("Deployment", "rel-dayzero-runner")])["args"] == ["runner"]
    api = _container(docs[("Deployment", "rel-dayzero-api")])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pre = _container(docs[("Deployment", "rel-dayzero-worker-preprocess")])
    assert pre["args"] == ["worker", "--queues", "preprocess", "--concurrency", "2"]
    assert ("HorizontalPodAutoscaler", "rel-dayzero-worker-preprocess") in docs  # scales on its own
    env = {e["name"]: e for e in api["env"]}
    assert env["DATABASE_URL"]["valueFrom"]["secretKeyRef"]["name"] == "rel-dayzero-secrets"
    secret = docs[("Secret", "rel-dayzero-secrets")]
    assert secret["stringData"]["CELERY_RESULT_BACKEND"] == "redis://redis:6379/0"
    job = next(d for (k, _), d in docs.items() if k == "Job")
    assert _container_job(job)["args"] == ["db", "upgrade"]
    assert "KAFKA_BOOTSTRAP_SERVERS" not in docs[("ConfigMap", "rel-dayzero-config")]["data"]


def _container_job(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


def test_kafka_and_gpu_inference_when_enabled():
    values = {
        **REQUIRED,
        "kafka": {"enabled": True, "bootstrapServers": "kafka:9092"},
        "inference": {
            "enabled": True,
            "gpus": 2,
            "modelVolume": {"persistentVolumeClaim": {"claimName": "kimi"}},
        },
    }
    docs = _render(values)
    assert _container(docs[("Deployment", "rel-dayzero-ingest")])["args"] == ["ingest"]
    inf = docs[("Deployment", "rel-dayzero-inference")]
    c = _container(inf)
    assert c["resources"]["limits"]["nvidia.com/gpu"] == 2
    assert c["args"][:4] == ["infer", "serve", "--model", "/models/model"]
    assert inf["spec"]["template"]["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == "kimi"
    cfg = docs[("ConfigMap", "rel-dayzero-config")]["data"]
    assert cfg["DAYZERO_INFERENCE_URL"] == "http://rel-dayzero-inference:8000"
    assert cfg["KAFKA_BOOTSTRAP_SERVERS"] == "kafka:9092"


def test_missing_database_url_is_a_clear_error():
    with pytest.raises(helm_python.HelmError, match=r"database\.url is required"):
        _render({"celery": {"brokerUrl": "redis://r"}})

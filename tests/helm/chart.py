"""Rendering the chart offline (Helm's own Go SDK through helm_python, no cluster) for the tests."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import helm_python
import yaml

CHART = Path(__file__).resolve().parents[2] / "helm" / "dayzero"
RELEASE = "rel"
PREFIX = f"{RELEASE}-dayzero"
REQUIRED: dict[str, Any] = {
    "database": {"url": "postgresql+psycopg://u:p@pg:5432/dz"},
    "celery": {"brokerUrl": "redis://redis:6379/0"},
}


def merged(*overrides: dict[str, Any]) -> dict[str, Any]:
    """REQUIRED with `overrides` merged in, deeply (later wins)."""
    out = copy.deepcopy(REQUIRED)
    for o in overrides:
        _merge(out, copy.deepcopy(o))
    return out


def _merge(into: dict[str, Any], other: dict[str, Any]) -> None:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v


GPU_INFERENCE = {
    "inference": {
        "enabled": True,
        "gpus": 2,
        "model": {"source": "pvc", "claimName": "kimi", "subPath": "kimi-linear-48b"},
    }
}
KAFKA = {"kafka": {"enabled": True, "bootstrapServers": "kafka:9092"}}
KEDA_REDIS = {
    "workers": {
        "preprocess": {"queueScaling": {"enabled": True, "broker": "redis", "redisAddress": "redis:6379"}}
    }
}
KEDA_RABBITMQ = {
    "celery": {"brokerUrl": "amqp://dz:pw@rabbitmq:5672/"},
    "workers": {"preprocess": {"queueScaling": {"enabled": True, "broker": "rabbitmq"}}},
}
EXISTING_SECRET = {
    "secret": {"existingSecret": "dz-creds"},
    "database": {"url": ""},
    "celery": {"brokerUrl": ""},
}

# What a production install looks like: Kafka, GPU inference with tensor parallelism off, every
# autoscaler and the operator integrations on, a managed Secret, shared storage.
PRODUCTION = merged(
    GPU_INFERENCE,
    KAFKA,
    KEDA_REDIS,
    {
        "image": {"tag": "0.1.0"},
        "secret": {"existingSecret": "dz-creds"},
        "database": {"url": ""},
        "celery": {"brokerUrl": ""},
        "storage": {"existingClaim": "dayzero-data"},
        "serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}},
        "networkPolicy": {
            "apiFrom": [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ingress"}}}],
            "metricsFrom": [
                {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
            ],
        },
        "api": {"autoscaling": {"enabled": True}},
        "runner": {"autoscaling": {"enabled": True}},
        "workers": {"tools": {"autoscaling": {"enabled": True}}},
        "inference": {"antiAffinity": "hard", "replicas": 2},
        "tracing": {"otlpEndpoint": "http://otel-collector:4318"},
        "dashboards": {"enabled": True},
    },
)

# The value sets every rendered object is checked against the Kubernetes schemas with.
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": merged(),
    "gpu-inference": merged(GPU_INFERENCE),
    "tensor-parallel-image-volume": merged(
        {
            "inference": {
                "enabled": True,
                "gpus": 4,
                "tensorParallelSize": 4,
                "model": {"source": "image", "imageReference": "registry.example/kimi-weights:1"},
            }
        }
    ),
    "cpu-dummy-inference": merged({"inference": {"enabled": True, "gpus": 0, "model": {"source": "dummy"}}}),
    "kafka": merged(KAFKA),
    "hpa-off": merged({"workers": {"preprocess": {"autoscaling": {"enabled": False}}}}),
    "keda-redis": merged(
        KEDA_REDIS, {"workers": {"preprocess": {"queueScaling": {"redisPasswordKey": "REDIS_PASSWORD"}}}}
    ),
    "keda-rabbitmq": merged(KEDA_RABBITMQ),
    "existing-secret": merged(EXISTING_SECRET),
    "created-storage": merged({"storage": {"create": {"enabled": True, "storageClassName": "nfs"}}}),
    "policies-off": merged({"networkPolicy": {"enabled": False}, "podDisruptionBudget": {"enabled": False}}),
    "production": PRODUCTION,
}


def render_files(values: dict[str, Any], *, revision: int = 1) -> dict[str, str]:
    chart = helm_python.Chart.load(str(CHART))
    try:
        return chart.render(values, name=RELEASE, namespace="ns", revision=revision, is_install=True)
    finally:
        chart.close()


def render(values: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """Every rendered object, by (kind, name)."""
    docs: dict[tuple[str, str], dict[str, Any]] = {}
    for path, text in render_files(values).items():
        if not path.endswith((".yaml", ".yml")):
            continue
        for doc in yaml.safe_load_all(text):
            if doc:
                key = (doc["kind"], doc["metadata"]["name"])
                if key in docs:
                    raise AssertionError(f"{key} rendered twice")
                docs[key] = doc
    return docs


def pod_spec(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["spec"]["template"]["spec"]


def container(doc: dict[str, Any]) -> dict[str, Any]:
    return pod_spec(doc)["containers"][0]


def workloads(docs: dict[tuple[str, str], dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Deployments and Jobs by name."""
    return {name: d for (kind, name), d in docs.items() if kind in ("Deployment", "StatefulSet", "Job")}


def env_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in c.get("env", [])}

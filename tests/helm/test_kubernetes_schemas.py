"""Every object the chart renders, for every value set, validates against the Kubernetes API's own
JSON schemas (strict: unknown fields are errors) of a recent release, bundled in the
`kubernetes-validate` package; the operator CRDs (KEDA, Prometheus operator) against the schemas
committed in crd_schemas/. Nothing is downloaded."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from tests.helm.chart import VALUE_SETS, container, render, workloads

KUBERNETES_VERSION = "1.37.0"
CRD_SCHEMAS = Path(__file__).parent / "crd_schemas"
CRD_KINDS = {
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject-keda-v1alpha1.json",
    ("keda.sh/v1alpha1", "TriggerAuthentication"): "triggerauthentication-keda-v1alpha1.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor-monitoring-v1.json",
}


def validate(doc: dict[str, Any]) -> None:
    """Raise on an object Kubernetes (or the operator owning its CRD) would refuse."""
    crd = CRD_KINDS.get((doc["apiVersion"], doc["kind"]))
    if crd is not None:
        schema = json.loads((CRD_SCHEMAS / crd).read_text())
        jsonschema.Draft7Validator(schema).validate(doc)
        return
    kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("value_set", sorted(VALUE_SETS))
def test_every_rendered_object_validates(value_set: str):
    docs = render(VALUE_SETS[value_set])
    assert docs
    for (kind, name), doc in docs.items():
        try:
            validate(doc)
        except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as exc:
            path = ".".join(str(p) for p in exc.path)
            pytest.fail(f"{value_set}: {kind}/{name} at {path}: {exc.message}")
        except kubernetes_validate.utils.SchemaNotFoundError as exc:
            pytest.fail(f"{value_set}: {kind}/{name}: {exc.message}")


def test_the_validation_catches_what_kubernetes_refuses():
    docs = render(VALUE_SETS["production"])
    api = copy.deepcopy(docs[("Deployment", "rel-dayzero-api")])
    container(api)["securityContext"]["readOnlyRootFS"] = True  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError, match="readOnlyRootFS"):
        validate(api)
    api = copy.deepcopy(docs[("Deployment", "rel-dayzero-api")])
    api["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        validate(api)
    scaled = copy.deepcopy(docs[("ScaledObject", "rel-dayzero-worker-preprocess")])
    scaled["spec"]["triggers"][0]["metadata"]["listLength"] = 10  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


def test_every_kind_the_chart_renders_has_a_schema():
    kinds = set()
    for values in VALUE_SETS.values():
        kinds |= {(d["apiVersion"], d["kind"]) for d in render(values).values()}
    # The value sets between them reach every template.
    assert {k for _, k in kinds} >= {
        "Deployment", "Service", "ConfigMap", "Secret", "Job", "ServiceAccount", "NetworkPolicy",
        "PodDisruptionBudget", "HorizontalPodAutoscaler", "PersistentVolumeClaim", "ScaledObject",
        "TriggerAuthentication", "ServiceMonitor",
    }  # fmt: skip
    for api_version, kind in kinds:
        if (api_version, kind) in CRD_KINDS:
            continue
        group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        schema = f"kubernetes-json-schema/v{KUBERNETES_VERSION}-local-strict/{kind.lower()}-{group}.json"
        assert kubernetes_validate.utils.schema_contents(schema, KUBERNETES_VERSION), (api_version, kind)


def test_value_sets_cover_every_workload():
    seen = set()
    for values in VALUE_SETS.values():
        seen |= set(workloads(render(values)))
    assert {n.removeprefix("rel-dayzero-") for n in seen if "migrate" not in n} == {
        "api", "runner", "relay", "ingest", "worker-preprocess", "worker-tools", "inference",
    }  # fmt: skip

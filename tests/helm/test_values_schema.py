"""values.schema.json (JSON Schema draft 7): refuses bad values with a message naming the key, and
`helm lint` is clean for the defaults and a production-like value set."""

from __future__ import annotations

import json

import helm_python
import jsonschema
import pytest

from tests.helm.chart import CHART, PRODUCTION, REQUIRED, VALUE_SETS, merged, render

SCHEMA = json.loads((CHART / "values.schema.json").read_text())


def test_schema_is_draft_7_and_the_defaults_satisfy_it():
    assert SCHEMA["$schema"] == "http://json-schema.org/draft-07/schema#"
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    chart = helm_python.Chart.load(str(CHART))
    try:
        for values in VALUE_SETS.values():
            chart.validate_schema(values)
    finally:
        chart.close()


INVALID = [
    pytest.param({"celery": {"brokerUrl": "redis://r"}}, r"at '/database/url': minLength: got 0, want 1", id="missing-database-url"),
    pytest.param({"database": {"url": "postgresql://x"}}, r"at '/celery/brokerUrl': minLength", id="missing-broker-url"),
    pytest.param(merged({"api": {"replicas": -1}}), r"at '/api/replicas': minimum: got -1, want 0", id="negative-replicas"),
    pytest.param(merged({"workers": {"tools": {"replicas": -3}}}), r"at '/workers/tools/replicas': minimum: got -3", id="negative-worker-replicas"),
    pytest.param(merged({"replicas": 3}), r"at '': additional properties 'replicas' not allowed", id="unknown-top-level-key"),
    pytest.param(merged({"runner": {"replica": 3}}), r"at '/runner': additional properties 'replica' not allowed", id="misspelt-key"),
    pytest.param(merged({"inference": {"enabled": True}}), r"at '/inference/model/claimName': minLength", id="inference-without-weights"),
    pytest.param(merged({"inference": {"gpus": -1}}), r"at '/inference/gpus': minimum", id="negative-gpus"),
    pytest.param(merged({"inference": {"model": {"source": "s3"}}}), r"at '/inference/model/source'", id="unknown-model-source"),
    pytest.param(merged({"api": {"port": 70000}}), r"at '/api/port': maximum", id="port-out-of-range"),
    pytest.param(merged({"api": {"resources": {"limits": {"memory": "lots"}}}}), r"at '/api/resources/limits/memory'", id="bad-quantity"),
    pytest.param(merged({"workers": {"preprocess": {"queueScaling": {"broker": "kafka"}}}}), r"queueScaling/broker", id="unknown-broker"),
    pytest.param(merged({"image": {"digest": "latest"}}), r"at '/image/digest'", id="bad-digest"),
]  # fmt: skip


@pytest.mark.parametrize(("values", "message"), INVALID)
def test_schema_rejects(values, message):
    chart = helm_python.Chart.load(str(CHART))
    try:
        with pytest.raises(helm_python.HelmValuesError, match=message):
            chart.validate_schema(values)
    finally:
        chart.close()
    # An install (render) refuses them the same way.
    with pytest.raises(helm_python.HelmError, match=message):
        render(values)


def test_existing_secret_needs_no_urls():
    render(
        merged({"secret": {"existingSecret": "mine"}, "database": {"url": ""}, "celery": {"brokerUrl": ""}})
    )


@pytest.mark.parametrize("values", [REQUIRED, PRODUCTION], ids=["defaults", "production"])
def test_lint_is_clean(values):
    result = helm_python.lint(str(CHART), values, strict=True, kube_version="v1.35.0")
    assert result["errors"] == []
    assert [m for m in result["messages"] if m["severity"] >= 2] == []


def test_lint_reports_schema_errors():
    result = helm_python.lint(str(CHART), merged({"api": {"replicas": -1}}), strict=True)
    assert any("/api/replicas" in e for e in result["errors"] + [m["error"] for m in result["messages"]])

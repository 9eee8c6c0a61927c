"""The Grafana dashboards, the documented metric table and the processes' real registries agree:
every panel expression references metrics that exist, with labels they have; every metric a
process defines is documented with its labels; the chart ships each dashboard as a sidecar
ConfigMap."""

from __future__ import annotations

import json
import re
from pathlib import Path

import helm_python
import pytest
import yaml
from prometheus_client import REGISTRY, CollectorRegistry

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = sorted((REPO / "helm" / "dayzero" / "dashboards").glob("*.json"))
DOC = REPO / "docs" / "observability.md"
REQUIRED = {
    "database": {"url": "postgresql+psycopg://u:p@pg:5432/dz"},
    "celery": {"brokerUrl": "redis://redis:6379/0"},
}
_SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
# PromQL words that are not label names or metrics
_PROMQL = {"by", "without", "sum", "max", "min", "avg", "rate", "increase", "histogram_quantile", "le"}


def _families(registry: CollectorRegistry) -> dict[str, tuple[str, set[str]]]:
    """name -> (type, label names) of every dayzero family a registry serves."""
    out = {}
    for collector in list(registry._collector_to_names):
        label_names = set(getattr(collector, "_labelnames", ()))
        described = collector.describe() if hasattr(collector, "describe") else []
        for fam in [*described, *collector.collect()]:
            if fam.name.startswith("dayzero_"):
                labels = label_names | set(getattr(fam, "_labelnames", ()))
                labels |= {k for s in fam.samples for k in s.labels} - {"le"}
                out[fam.name] = (fam.type, labels | out.get(fam.name, ("", set()))[1])
    return out


@pytest.fixture(scope="module")
def real_metrics(tmp_path_factory) -> dict[str, tuple[str, set[str]]]:
    """Every family the orchestrator processes, the workers and the inference server define."""
    import orchestrator.metrics as om
    from inference.server.telemetry import ServerMetrics
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine
    from workers.celery_app import make_celery_app
    from workers.metrics import QueueDepthCollector  # (importing it registers the worker families)

    engine = make_engine(f"sqlite:///{tmp_path_factory.mktemp('db') / 'm.db'}")
    migrate.upgrade(engine)
    om.register_task_states(engine)  # the DB-backed gauges the API serves
    stats = {
        k: 0
        for k in (
            "num_running", "num_waiting", "kv_usage", "state_usage", "num_checkpoints", "prefix_hit_rate",
            "prompt_tokens_computed", "generated_tokens", "steps", "num_preemptions", "decode_graphs",
            "decode_graph_replays",
        )
    }  # fmt: skip
    worker = CollectorRegistry()
    celery = make_celery_app("memory://")
    worker.register(QueueDepthCollector(celery, ["tools"]))  # the worker's scrape-time queue gauge
    fams = {**_families(REGISTRY), **_families(ServerMetrics(lambda: stats).registry), **_families(worker)}
    celery.close()
    engine.dispose()
    return fams


def _documented() -> dict[str, tuple[str, set[str]]]:
    rows = re.findall(r"^\| `(dayzero_[a-z0-9_]+)` \| (\w+) \|([^|]*)\|", DOC.read_text(), re.M)
    return {n: (t, {x.strip() for x in labels.split(",") if x.strip()}) for n, t, labels in rows}


def _base(name: str, families: dict[str, tuple[str, set[str]]]) -> str | None:
    """The family a series name belongs to (`x_total` -> `x`, `x_bucket` -> `x`, …)."""
    for fam, (typ, _) in families.items():
        for suffix in _SUFFIXES[typ]:
            if name == fam + suffix or (typ == "counter" and name == fam):
                return fam
    return None


def _exprs() -> list[tuple[str, str, str]]:
    out = []
    for path in DASHBOARDS:
        for panel in json.loads(path.read_text())["panels"]:
            for target in panel["targets"]:
                out.append((path.name, panel["title"], target["expr"]))
    return out


def test_every_defined_metric_is_documented_with_its_labels(real_metrics):
    doc = _documented()
    # documentation names the exposed family: counters with their _total
    exposed = {
        (n + "_total" if t == "counter" else n): (t, labels) for n, (t, labels) in real_metrics.items()
    }
    assert set(doc) == set(exposed), (
        f"undocumented: {sorted(set(exposed) - set(doc))}; documented but gone: {sorted(set(doc) - set(exposed))}"
    )
    for name, (typ, labels) in exposed.items():
        assert doc[name] == (typ, labels), name


def test_dashboards_are_valid_and_reference_existing_metrics_and_labels(real_metrics):
    assert [p.stem for p in DASHBOARDS] == ["cache", "inference", "latency", "retries-dlq", "tasks"]
    uids = set()
    for path in DASHBOARDS:
        d = json.loads(path.read_text())
        assert d["uid"] not in uids and d["title"] and d["panels"]
        uids.add(d["uid"])
        assert [v["name"] for v in d["templating"]["list"]] == ["datasource"]
        ids = [p["id"] for p in d["panels"]]
        assert len(ids) == len(set(ids))
        for p in d["panels"]:
            assert p["targets"], p["title"]
            assert p["datasource"]["uid"] == "${datasource}"
            assert len({t["refId"] for t in p["targets"]}) == len(p["targets"])
    used = set()
    for file, title, expr in _exprs():
        names = re.findall(r"\bdayzero_[a-z0-9_]+", expr)
        assert names, (file, title, expr)
        fams = []
        for n in names:
            fam = _base(n, real_metrics)
            assert fam is not None, f"{file} / {title}: {n} is no metric any process defines"
            fams.append(fam)
            used.add(fam)
        labels = set().union(*(real_metrics[f][1] for f in fams))
        selectors = re.findall(r"\{([^}]*)\}", expr.replace("{{", "").replace("}}", ""))
        written = {m for s in selectors for m in re.findall(r"(\w+)\s*(?:=~|!=|=)", s)}
        grouped = {x.strip() for g in re.findall(r"\bby \(([^)]*)\)", expr) for x in g.split(",")}
        assert (written | grouped) - {"le"} <= labels, (
            f"{file} / {title}: labels {written | grouped} vs {labels}"
        )
    # the dashboards cover the list: tasks, latency, retries/DLQ, inference, cache
    for must in (
        "dayzero_tasks", "dayzero_step_duration_seconds", "dayzero_step_retries", "dayzero_ingest_messages",
        "dayzero_runner_leases_lost", "dayzero_inference_generation_tokens",
        "dayzero_inference_time_to_first_token_seconds", "dayzero_inference_inter_token_latency_seconds",
        "dayzero_inference_prefix_cache_hit_ratio", "dayzero_inference_cache_usage_ratio",
        "dayzero_preprocess_input_bytes", "dayzero_tasks_runnable",
    ):  # fmt: skip
        assert must in used, must


def test_chart_ships_each_dashboard_as_a_sidecar_configmap():
    def render(values: dict) -> list[dict]:
        chart = helm_python.Chart.load(str(REPO / "helm" / "dayzero"))
        try:
            files = chart.render(values, name="rel", namespace="ns", is_install=True)
        finally:
            chart.close()
        text = files.get("dayzero/templates/dashboards-configmap.yaml", "")
        return [d for d in yaml.safe_load_all(text) if d]

    docs = render(REQUIRED)
    assert sorted(d["metadata"]["name"] for d in docs) == [
        f"rel-dayzero-dashboard-{p.stem}" for p in DASHBOARDS
    ]
    for d, path in zip(sorted(docs, key=lambda d: d["metadata"]["name"]), DASHBOARDS, strict=True):
        assert d["kind"] == "ConfigMap" and d["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert json.loads(d["data"][path.name]) == json.loads(path.read_text())
    custom = render(
        {
            **REQUIRED,
            "dashboards": {"label": "dash", "labelValue": "yes", "annotations": {"grafana_folder": "dz"}},
        }
    )
    assert all(d["metadata"]["labels"]["dash"] == "yes" for d in custom)
    assert all(d["metadata"]["annotations"] == {"grafana_folder": "dz"} for d in custom)
    assert render({**REQUIRED, "dashboards": {"enabled": False}}) == []
    assert helm_python.lint(str(REPO / "helm" / "dayzero"), REQUIRED, strict=True)["errors"] == []

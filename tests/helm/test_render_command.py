"""`python helm/render.py lint|template`, the chart check for users without a `helm` binary: the
same verdicts and manifests as the tests' rendering, values from files and `--set`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from tests.helm.chart import merged, render_files

SCRIPT = Path(__file__).resolve().parents[2] / "helm" / "render.py"
SETS = [
    "--set",
    "database.url=postgresql+psycopg://u:p@pg:5432/dz",
    "--set",
    "celery.brokerUrl=redis://redis:6379/0",
]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_lint_refuses_missing_and_bad_values_and_passes_good_ones(tmp_path):
    bad = _run("lint")
    assert bad.returncode == 1 and "/database/url" in bad.stdout and "[ERROR]" in bad.stdout
    (tmp_path / "v.yaml").write_text("api:\n  replicas: -1\n")
    negative = _run("lint", "-f", str(tmp_path / "v.yaml"), *SETS)
    assert negative.returncode == 1 and "/api/replicas" in negative.stdout
    good = _run("lint", *SETS)
    assert good.returncode == 0, good.stdout + good.stderr
    assert good.stdout.strip().endswith("1 chart(s) linted, 0 error(s)")


def test_template_prints_what_helm_would_apply(tmp_path):
    (tmp_path / "v.yaml").write_text("kafka: {enabled: true, bootstrapServers: 'kafka:9092'}\n")
    out = _run("template", "-f", str(tmp_path / "v.yaml"), *SETS, "--set", "image.repository=reg.example/dz",
               "--name", "rel", "--namespace", "ns")  # fmt: skip
    assert out.returncode == 0, out.stderr
    printed = [d for d in yaml.safe_load_all(out.stdout) if d]
    values = merged(
        {
            "kafka": {"enabled": True, "bootstrapServers": "kafka:9092"},
            "image": {"repository": "reg.example/dz"},
        }
    )
    expected = [
        d
        for path, text in sorted(render_files(values).items())
        if path.endswith((".yaml", ".yml"))
        for d in yaml.safe_load_all(text)
        if d
    ]
    assert [(d["kind"], d["metadata"]["name"]) for d in printed] == [
        (d["kind"], d["metadata"]["name"]) for d in expected
    ]
    images = {
        c["image"]
        for d in printed
        if d["kind"] == "Deployment"
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {"reg.example/dz:0.1.0"}

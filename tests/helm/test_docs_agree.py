"""docs/kubernetes.md says what the chart renders: its "What the chart runs" table (command,
probes, probe port, startup allowance) against the Deployments of the production value set,
where every component is on; and every `helm install` line in the docs names an image that
exists (none is published: each sets `image.repository`, or takes a values file that does)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from tests.helm.chart import PREFIX, VALUE_SETS, container, render

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "kubernetes.md"
PROBES = ("livenessProbe", "readinessProbe", "startupProbe")


def _table() -> dict[str, dict[str, str]]:
    """The rows of the table whose header starts with `| component | command | liveness`."""
    lines = DOC.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| component | command | liveness"))
    header = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = dict(zip(header, (c.strip() for c in line.strip("|").split("|")), strict=True))
        rows[cells["component"]] = cells
    return rows


def _probe(p: dict) -> str:
    if "httpGet" in p:
        return f"`{p['httpGet']['path']}`"
    command = " ".join(p["exec"]["command"])
    assert re.search(r"celery .*inspect ping --destination \"celery@\$POD_NAME\"", command), command
    return "`celery inspect ping`"


def _minutes(p: dict) -> str:
    return f"{p['failureThreshold'] * p['periodSeconds'] / 60:g} min"


def test_the_docs_table_is_what_the_chart_renders():
    docs = render(VALUE_SETS["production"])
    deployments = {
        name.removeprefix(PREFIX + "-"): d for (kind, name), d in docs.items() if kind == "Deployment"
    }
    table = _table()
    assert sorted(table) == sorted(deployments)
    for component, row in table.items():
        c = container(deployments[component])
        documented = shlex.split(row["command"].strip("`"))
        assert documented == ["dayzero", *c["args"]][: len(documented)], component
        probes = [c[k] for k in PROBES]
        assert [row["liveness"], row["readiness"], row["startup"]] == [_probe(p) for p in probes], component
        ports = {p["httpGet"]["port"] for p in probes if "httpGet" in p}
        assert row["port"] == (f"`{ports.pop()}`" if ports else ""), component
        assert row["startup allows"].split(" (")[0] == _minutes(c["startupProbe"]), component


def test_every_helm_install_line_names_a_buildable_image():
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = page.read_text().replace("\\\n", " ")
        # the commands: `helm install RELEASE helm/dayzero …` to the end of the line or inline code
        for command in re.findall(r"helm install \S+ helm/dayzero[^`\n]*", text):
            assert "image.repository=" in command or re.search(r" -f \S+\.yaml", command), (
                f"{page.name}: {command}"
            )

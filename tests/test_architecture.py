"""The dependency rules of ARCHITECTURE.md, checked in fresh interpreters."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _loaded_after(imports: str) -> set[str]:
    code = f"import sys; {imports}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_orchestrator_starts_without_torch():
    mods = _loaded_after(
        "import orchestrator.cli as c; c.build_parser(); import orchestrator.api.app, orchestrator.runner, "
        "orchestrator.app, orchestrator.kafka.ingest, orchestrator.kafka.relay"
    )
    assert "torch" not in mods


def _imported_packages(package: str) -> set[str]:
    found = set()
    for path in (REPO / package).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found.add(node.module.split(".")[0])
    return found


@pytest.mark.parametrize(
    ("package", "forbidden"),
    [
        ("inference", {"orchestrator", "workers", "tools", "training"}),
        ("tools", {"orchestrator", "workers", "inference", "training"}),
        ("preprocess", {"orchestrator", "workers", "tools", "inference", "training"}),
        ("workers", {"orchestrator", "inference", "training"}),
        ("orchestrator", {"training"}),
        ("core", {"orchestrator", "workers", "tools", "inference", "preprocess", "training"}),
        ("benchmarks", {"tests"}),  # shared helpers live in `testing/`
        ("testing", {"tests", "benchmarks"}),
    ],
)
def test_dependencies_point_one_way(package, forbidden):
    assert not (_imported_packages(package) & forbidden)


def _import_graph():
    from benchmarks import import_graph

    return import_graph


@pytest.mark.parametrize(
    "package", ["core", "orchestrator", "workers", "tools", "preprocess", "inference", "training"]
)
def test_no_import_circles(package):
    """No two modules reach each other through imports (module- or function-level): a factory
    imports its planner, a step takes a context object, shared records live below both users."""
    graph = _import_graph()
    _, edges = graph.build_graph((package,), REPO)
    assert graph.circles(edges) == []


def test_inference_imports_point_down_its_layers():
    """specs < kernels < model < cache < engine < parallel < factory < chat < server
    (`benchmarks/import_graph.py`'s `LAYERS`)."""
    graph = _import_graph()
    _, edges = graph.build_graph(("inference",), REPO)
    assert [f"{e.source}:{e.line} -> {e.target}" for e in graph.upward_imports(edges)] == []


@pytest.mark.parametrize(
    "package",
    ["core", "orchestrator", "workers", "tools", "preprocess", "inference", "training", "benchmarks"],
)
def test_no_module_over_500_lines(package):
    graph = _import_graph()
    files, _ = graph.build_graph((package,), REPO)
    assert graph.big_files(files) == {}


def test_the_task_model_does_not_import_the_http_layer():
    """`orchestrator/tasks/` owns the task model; `orchestrator/api/` only speaks HTTP over it."""
    offenders = []
    for path in (REPO / "orchestrator" / "tasks").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            mods = []
            if isinstance(node, ast.Import):
                mods = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                mods = [node.module]
            offenders += [f"{path.name}: {m}" for m in mods if m.startswith("orchestrator.api")]
    assert not offenders, offenders

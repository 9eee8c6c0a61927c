"""The kernel registry: one rule picks every op family's path, and `DAYZERO_KERNELS` reaches all of them."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from inference.config import parse_config
from inference.engine.factory import small_model_config
from inference.kernels import registry
from inference.model.factory import build_model

KERNELS = Path(registry.__file__).parent
INFERENCE = KERNELS.parent
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def test_every_family_folder_is_registered():
    folders = {p.parent.name for p in KERNELS.glob("*/__init__.py")}
    sub_families = {"kda_decode"}  # a second entry point of the `kda` folder
    assert folders == set(registry.FAMILIES) - sub_families


@pytest.mark.parametrize("family", sorted(registry.FAMILIES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reference_mode_reports_the_reference_for_every_family(monkeypatch, family, dtype):
    monkeypatch.setenv("DAYZERO_KERNELS", "reference")
    for device in ("cuda", "cpu"):
        assert registry.select(family, device, dtype) == "reference"


@pytest.mark.parametrize("family", sorted(registry.FAMILIES))
def test_fast_mode_picks_the_fast_path_where_its_needs_are_met(monkeypatch, family):
    monkeypatch.setenv("DAYZERO_KERNELS", "fast")
    f = registry.FAMILIES[family]
    dtype = f.dtypes[0] if f.dtypes else torch.bfloat16
    packages = {"fla": registry.fla_installed(), "torch._grouped_mm": registry.grouped_mm_available()}
    want = "fast" if f.fast and packages.get(f.package, True) else "reference"
    path, why = registry.selection(family, "cuda", dtype)
    assert path == want, why
    assert registry.select(family, "cpu", dtype) == "reference"


def test_interpret_mode_runs_only_our_triton_code_on_cpu(monkeypatch):
    monkeypatch.setenv("DAYZERO_KERNELS", "interpret")
    for name, f in registry.FAMILIES.items():
        want = "fast" if f.triton and f.fast else "reference"
        assert registry.select(name, "cpu", torch.float32) == want, name


def test_unknown_mode_is_refused(monkeypatch):
    monkeypatch.setenv("DAYZERO_KERNELS", "fastest")
    with pytest.raises(registry.KernelModeError, match="reference"):
        registry.select("rmsnorm", "cuda", torch.bfloat16)


def test_the_model_asks_the_registry_for_its_graph_capability(monkeypatch):
    """The grouped MoE (what makes an MoE decode step capturable) follows `DAYZERO_KERNELS` too."""
    model = build_model(parse_config(small_model_config()), load_format="dummy", dtype=torch.float32)
    monkeypatch.setenv("DAYZERO_KERNELS", "fast")
    assert model.supports_decode_graphs(torch.bfloat16) == registry.grouped_mm_available()
    monkeypatch.setenv("DAYZERO_KERNELS", "reference")
    assert not model.supports_decode_graphs(torch.bfloat16)
    assert not model.supports_short_step_graphs(torch.bfloat16)


def _code_strings(path: Path) -> set[str]:
    """String constants of a module other than docstrings."""
    tree = ast.parse(path.read_text())
    docs = {
        id(n.body[0].value)
        for n in ast.walk(tree)
        if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and n.body
        and isinstance(n.body[0], ast.Expr)
        and isinstance(n.body[0].value, ast.Constant)
    }
    return {
        n.value
        for n in ast.walk(tree)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
    }


def _imports_fla(path: Path) -> bool:
    for n in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in n.names] if isinstance(n, ast.Import) else []
        if isinstance(n, ast.ImportFrom) and n.module and not n.level:
            names = [n.module]
        if any(name == "fla" or name.startswith("fla.") for name in names):
            return True
    return False


def test_the_rule_lives_in_the_registry_alone():
    """No other inference module reads `DAYZERO_KERNELS`; fla is imported only by the KDA fast path
    (and the registry's availability probe)."""
    readers = {
        p.relative_to(INFERENCE).as_posix()
        for p in INFERENCE.rglob("*.py")
        if "DAYZERO_KERNELS" in _code_strings(p)
    }
    assert readers == {"kernels/registry.py"}
    fla = {p.relative_to(INFERENCE).as_posix() for p in INFERENCE.rglob("*.py") if _imports_fla(p)}
    assert fla == {"kernels/registry.py", "kernels/kda/fast.py"}

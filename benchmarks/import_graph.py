"""The module import graph of the project's packages: circles, imports that run up the layers, big files.

Parses every `.py` file of the packages with `ast` (nothing is imported or executed) and builds
the graph of imports between our own modules. Three kinds of import edge are told apart:

- `top`: runs when the module is imported (module level, including `try`/`if` blocks);
- `function`: inside a function or method body (runs on the first call);
- `typing`: under `if TYPE_CHECKING:` (never runs; not an edge of the graph).

It reports:

- circles: strongly connected components of the graph of `top` and `function` edges (a lazy import
  inside a function still ties the two modules together), each with the edges that close it;
- upward imports: a module of a layered package importing a module that `LAYERS` ranks above
  its own (for `inference`: specs < kernels < model < cache < engine < parallel <
  factory < chat < server);
- files over `MAX_LINES` lines (tests excluded).

Run from the repository root:

    python -m benchmarks.import_graph                      # every package, JSON on stdout
    python -m benchmarks.import_graph inference training   # some packages
    python -m benchmarks.import_graph --out graph.json     # also write the JSON to a file

`tests/test_architecture.py` imports `build_graph`, `circles` and `upward_imports` to hold the
figures at zero.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "orchestrator", "workers", "tools", "preprocess", "inference", "training", "migrations")
MAX_LINES = 500

# Layer order of each layered package, lowest first: a module may import its own layer and the
# layers below. An entry is a subpackage or module under the package (`kernels`) or a module deeper
# down (`parallel.split_rule`); the longest entry that prefixes a module's name ranks it. Names
# missing here are unranked (never "upward").
LAYERS: dict[str, tuple[tuple[str, ...], ...]] = {
    "inference": (
        # specs and torch-free rules: config parsing, tokenizers, output parsers, grammars, the cache
        # spec (its byte arithmetic) and the parallel split rule, which `analyze` counts by and the
        # pools / `parallel/sharding.py` build by
        (
            "config",
            "tokenizer",
            "parsers",
            "structured",
            "demo_model",
            "cache.spec",
            "parallel.config",
            "parallel.split_rule",
        ),
        ("kernels",),
        ("model", "quantized_weights", "weight_errors", "loader", "analyze"),
        ("cache",),
        ("engine",),
        ("parallel",),
        # the composition root: builds the single-GPU engine or the parallel one
        ("engine.factory",),
        ("chat",),
        ("server", "embedded", "commands"),
    ),
}


@dataclass(frozen=True, slots=True)
class Edge:
    """`source` imports `target` (dotted module names) at `line`, of kind top/function/typing."""

    source: str
    target: str
    line: int
    kind: str


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import statement of a module with its kind."""
    found: list[tuple[ast.Import | ast.ImportFrom, str]] = []

    def visit(node: ast.AST, kind: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                found.append((child, kind))
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                visit(child, "function" if kind == "top" else kind)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    visit(ast.Module(body=[stmt], type_ignores=[]), "typing")
                for stmt in child.orelse:
                    visit(ast.Module(body=[stmt], type_ignores=[]), kind)
            else:
                visit(child, kind)

    visit(tree, "top")
    return found


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, known: set[str]) -> list[str]:
    """Our modules an import statement loads (not the implicit parent packages)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in known]
    if node.level:
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    out = []
    for alias in node.names:
        sub = f"{prefix}.{alias.name}"
        if sub in known:  # `from pkg import submodule`
            out.append(sub)
        elif prefix in known:
            out.append(prefix)
    return sorted(set(out))


def build_graph(
    packages: tuple[str, ...] = PACKAGES, root: Path = REPO
) -> tuple[dict[str, Path], list[Edge]]:
    """The modules of `packages` (name -> file) and the import edges between them."""
    files: dict[str, Path] = {}
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            files[_module_name(path, root)] = path
    known = set(files)
    edges: list[Edge] = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node, kind in _imports(tree):
            for target in _targets(node, module, path.name == "__init__.py", known):
                if target != module:
                    edges.append(Edge(module, target, node.lineno, kind))
    return files, edges


def circles(edges: list[Edge], kinds: tuple[str, ...] = ("top", "function")) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for e in edges:
        if e.kind in kinds:
            graph.setdefault(e.source, set()).add(e.target)
            graph.setdefault(e.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    if len(comp) > 1:
                        found.append(sorted(comp))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def _rank(module: str) -> tuple[str, int] | None:
    parts = module.split(".")
    layers = LAYERS.get(parts[0])
    if layers is None or len(parts) < 2:
        return None
    best: tuple[int, int] | None = None  # (entry length, rank)
    for rank, names in enumerate(layers):
        for name in names:
            entry = name.split(".")
            if parts[1 : 1 + len(entry)] == entry and (best is None or len(entry) > best[0]):
                best = (len(entry), rank)
    return None if best is None else (parts[0], best[1])


def upward_imports(edges: list[Edge], kinds: tuple[str, ...] = ("top", "function")) -> list[Edge]:
    """Edges from a module to a sibling subpackage ranked above its own in `LAYERS`."""
    out = []
    for e in edges:
        src, dst = _rank(e.source), _rank(e.target)
        if e.kind in kinds and src and dst and src[0] == dst[0] and dst[1] > src[1]:
            out.append(e)
    return out


def big_files(files: dict[str, Path], limit: int = MAX_LINES) -> dict[str, int]:
    """Non-test modules over `limit` lines, with their line counts."""
    sizes = {m: len(p.read_text().splitlines()) for m, p in files.items()}
    return {m: n for m, n in sorted(sizes.items()) if n > limit}


def report(packages: tuple[str, ...]) -> dict:
    files, edges = build_graph(packages)
    by_pair = {(e.source, e.target): e for e in edges if e.kind != "typing"}
    found = circles(edges)

    def closing(comp: list[str]) -> list[str]:
        members = set(comp)
        return [
            f"{e.source}:{e.line} -> {e.target} ({e.kind})"
            for (s, t), e in sorted(by_pair.items())
            if s in members and t in members
        ]

    return {
        "packages": list(packages),
        "modules": len(files),
        "edges": {k: sum(e.kind == k for e in edges) for k in ("top", "function", "typing")},
        "function_level_imports": [
            f"{e.source}:{e.line} -> {e.target}" for e in edges if e.kind == "function"
        ],
        "circles": [{"modules": c, "edges": closing(c)} for c in found],
        "circles_top_level_only": circles(edges, ("top",)),
        "upward_imports": [f"{e.source}:{e.line} -> {e.target} ({e.kind})" for e in upward_imports(edges)],
        "files_over_limit": big_files(files),
        "counts": {
            "circles": len(found),
            "upward_imports": len(upward_imports(edges)),
            "files_over_limit": len(big_files(files)),
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES))
    parser.add_argument("--out", type=Path, help="also write the JSON here")
    args = parser.parse_args(argv)
    out = report(tuple(args.packages))
    print(f"parsed {out['modules']} modules", file=sys.stderr)
    text = json.dumps(out, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()

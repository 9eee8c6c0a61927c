"""Lint or render the dayzero chart where no `helm` binary is installed, with Helm's own Go SDK
(`pip install helm-python-sdk==0.2.2`, a dev dependency of this repository):

    python helm/render.py lint     [-f VALUES.yaml ...] [--set KEY=VALUE ...]
    python helm/render.py template [-f VALUES.yaml ...] [--set KEY=VALUE ...] [--name N] [--namespace NS]

They do what `helm lint --strict helm/dayzero` and `helm template N helm/dayzero` do with the same
values: `lint` prints every finding and exits 1 on an error (a value the schema refuses
included); `template` prints the manifests `helm install` would apply.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

CHART = Path(__file__).resolve().parent / "dayzero"
SEVERITY = {1: "INFO", 2: "WARNING", 3: "ERROR"}


def _merge(into: dict[str, Any], other: dict[str, Any]) -> dict[str, Any]:
    for k, v in other.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
    return into


def values(files: list[str], sets: list[str]) -> dict[str, Any]:
    """The values as Helm merges them: each `-f` file in order, then each `--set`."""
    import helm_python

    out: dict[str, Any] = {}
    for f in files:
        _merge(out, helm_python.values_from_yaml(Path(f).read_text()))
    for s in sets:
        _merge(out, helm_python.parse_set_string(s))
    return out


def lint(vals: dict[str, Any]) -> int:
    import helm_python

    report = helm_python.lint(str(CHART), vals, strict=True)
    for m in report["messages"]:
        print(f"[{SEVERITY.get(m['severity'], m['severity'])}] {m['path']}: {m['error'].strip()}")
    print(f"{report['total_charts_linted']} chart(s) linted, {len(report['errors'])} error(s)")
    return 1 if report["errors"] else 0


def template(vals: dict[str, Any], name: str, namespace: str) -> int:
    import helm_python

    chart = helm_python.Chart.load(str(CHART))
    try:
        files = chart.render(vals, name=name, namespace=namespace, revision=1, is_install=True)
    finally:
        chart.close()
    for path, text in sorted(files.items()):
        if path.endswith((".yaml", ".yml")) and text.strip():
            print(f"---\n# Source: {path}\n{text.strip()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python helm/render.py", description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=("lint", "template"), help="lint the chart, or print its manifests")
    p.add_argument(
        "-f", "--values", action="append", default=[], help="a values file (repeatable, later wins)"
    )
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE as `helm --set` (repeatable)")
    p.add_argument("--name", default="dayzero", help="release name (default: %(default)s)")
    p.add_argument("--namespace", default="dayzero", help="namespace (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        import helm_python
    except ImportError:
        print("helm-python-sdk is not installed: pip install helm-python-sdk==0.2.2", file=sys.stderr)
        return 2
    try:
        vals = values(args.values, args.set)
        if args.command == "lint":
            return lint(vals)
        return template(vals, args.name, args.namespace)
    except helm_python.HelmError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())

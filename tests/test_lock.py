"""The test environment is the committed lock file: every dependency is pinned there, and installed at its pin."""

from __future__ import annotations

import re
import tomllib
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LOCK = REPO / "requirements" / "dev.lock"


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;]+)", line)
        if m:
            pins[_canonical(m.group(1))] = m.group(2)
    return pins


def _requirement_name(req: str) -> str:
    return _canonical(re.match(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)", req).group(1))


def test_every_declared_dependency_is_in_the_lock():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {
        _requirement_name(r) for r in project["dependencies"] + project["optional-dependencies"]["dev"]
    }
    missing = declared - set(_pins(LOCK))
    assert not missing, f"not in {LOCK.name}: {sorted(missing)}; run `bash requirements/refresh.sh`"


def test_the_environment_is_installed_at_the_lock_pins():
    drifted = {}
    for name, pinned in _pins(LOCK).items():
        try:
            installed = metadata.version(name)
        except metadata.PackageNotFoundError:
            drifted[name] = (pinned, None)
            continue
        if installed != pinned:
            drifted[name] = (pinned, installed)
    assert not drifted, (
        f"installed packages differ from {LOCK.name} (pinned, installed): {drifted}; "
        "install with `pip install -c requirements/dev.lock -e '.[dev]'`"
    )

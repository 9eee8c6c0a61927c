"""`python -m benchmarks.day0_equivalence` on the CPU with the tiny configs: the script run on the
H200 produces its JSON and chart, and its fp32 figures are the equivalence CI already asserts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def test_cpu_smoke_run(tmp_path):
    cmd = [
        sys.executable,
        "-m",
        "benchmarks.day0_equivalence",
        "--tiny",
        "--device",
        "cpu",
        "--prompt",
        "40",
        "--decode",
        "6",
        "--greedy",
        "6",
    ]
    env = dict(os.environ, OUT=str(tmp_path), OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    res = json.loads((tmp_path / "day0_equivalence.json").read_text())
    for arch in ("deepseek_v32", "qwen3_next"):
        r = res[arch]
        for phase in ("prefill", "decode"):
            assert r["ours_fp32_vs_ref_fp32"][phase]["mean_rel"] < 1e-4, (arch, phase)
            assert r["ours_bf16_vs_ref_fp32"][phase]["mean_rel"] < 0.1, (arch, phase)  # bf16: ~1e-2
        assert r["greedy_ours_fp32_vs_ref_fp32"]["leading_equal"] == 6, arch
    svg = (tmp_path / "day0_equivalence.svg").read_text()
    assert svg.startswith("<svg") and svg.count("<rect") >= 12  # 3 series x 2 phases x 2 archs (+ legend)

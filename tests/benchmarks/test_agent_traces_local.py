"""`python -m benchmarks.agent_traces --services local`: the whole stack with no services (a SQLite
file shared by the API and the runners, tools in-process in each runner), as on a GPU host. What
the PostgreSQL path's test asserts holds here too: every turn after a task's first goes on the
wire incrementally and the prefix cache reuses at least 95% of the ideal; and the cold-prefill
baseline is a prompt the cache has never seen, its TTFT set beside the late turns'."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _run(tmp_path: Path, *args: str) -> dict[str, Any]:
    out = tmp_path / "traces.json"
    cmd = [sys.executable, "-m", "benchmarks.agent_traces", "--services", "local", "--dummy",
           "--tasks", "2", "--system-kb", "1", "--out", str(out), *args]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_", "CELERY_"))}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    (res,) = json.loads(out.read_text())["results"]
    return res


def _assert_incremental_and_cached(res: dict[str, Any]) -> None:
    for task in res["tasks"]:
        assert task["status"] == "SUCCEEDED", task["error"]
        rows = task["turns"]
        assert task["turns_completed"] == task["turns_planned"] == len(rows) >= 3, task
        assert rows[0]["wire"] == "full:no_base"
        assert all(r["wire"] == "incremental" for r in rows[1:]), [r["wire"] for r in rows]
        later = rows[1:]
        share = sum(min(r["cached_tokens"], r["ideal_cached_tokens"]) for r in later) / sum(
            r["ideal_cached_tokens"] for r in later
        )
        assert share >= 0.95, [(r["cached_tokens"], r["ideal_cached_tokens"]) for r in later]


def test_local_services_run_the_trace(tmp_path: Path) -> None:
    res = _run(tmp_path, "--sizes", "4096")
    _assert_incremental_and_cached(res)
    assert res["statuses"] == ["SUCCEEDED"] and res["turns_completed"] == [3, 3]
    # no turn 10 in a 3-turn trace: the baseline says why it did not run
    assert res["cold"] is None and "--max-turns" in res["cold_skipped"]


def test_cold_baseline_is_a_prompt_the_cache_never_saw(tmp_path: Path) -> None:
    # an 11-turn trace of small documents beside a 3-turn one: turns 10 and 11 exist
    res = _run(tmp_path, "--mixed", "11,3,0.25")
    _assert_incremental_and_cached(res)
    assert res["turns_completed"] == [11, 3]
    late = [r for r in res["tasks"][0]["turns"] if r["turn"] >= 9]
    cold = res["cold"]
    assert cold["status"] == "SUCCEEDED", cold["error"]
    assert cold["cached_tokens"] == 0
    assert 0.9 * cold["target_prompt_tokens"] <= cold["prompt_tokens"] <= 1.1 * cold["target_prompt_tokens"]
    assert res["turn10plus_turns"] == len(late) == 2
    p50 = sorted(r["ttft_ms"] for r in late)[1]  # the median as the benchmark takes it (upper of two)
    assert res["ttft_ms_p50_turn10plus"] == pytest.approx(p50, abs=1e-3)
    assert res["ttft_ratio_turn10plus"] == pytest.approx(p50 / res["cold_ttft_ms"], rel=1e-3)

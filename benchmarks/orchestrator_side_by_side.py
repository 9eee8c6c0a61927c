"""dayzero's orchestrator next to LangGraph + PostgresSaver on the same task, interleaved.

Runs `benchmarks.orchestrator_overhead` (this checkout; optionally an older one too, `--before DIR`, put
first on the path under `python -P`) and `langgraph_side_by_side.py` (under `--langgraph-python`, a venv with
`requirements/bench-langgraph.txt`) in turns, `--repeats` rounds, each a fresh process and a fresh
database; reports the median of each figure per system and their ratios to LangGraph, as JSON
(`--out`) and a bar chart (`--plot`, Pillow).

    python -m benchmarks.orchestrator_side_by_side --langgraph-python /tmp/venv-lg/bin/python \\
        --before /tmp/dayzero-before --repeats 3 --out side.json --plot side.png
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from rich.progress import Progress

REPO = Path(__file__).resolve().parents[1]
# (label, path into a run's JSON, lower is better)
FIGURES = [
    ("step p50 (ms)", ("one_runner", "step_ms_p50"), True),
    ("step p99 (ms)", ("one_runner", "step_ms_p99"), True),
    ("first step p50 (ms)", ("one_runner", "first_step_ms_p50"), True),
    ("later steps p99 (ms)", ("one_runner", "later_steps_ms_p99"), True),
    ("last step p50 (ms)", ("one_runner", "last_step_ms_p50"), True),
    ("runner CPU per step (ms)", ("one_runner", "runner_cpu_ms_per_step"), True),
    ("database CPU per step (ms)", ("one_runner", "db_cpu_ms_per_step"), True),
    ("steps/s, 1 runner", ("one_runner", "steps_per_s"), False),
    ("steps/s, 4 runners", ("many_runners", "steps_per_s"), False),
    ("CPU per step, 4 runners (ms)", ("many_runners", "cpu_ms_per_step"), True),
    ("WAL per task (KB)", ("one_runner", "wal_record_bytes_per_task"), True),
    ("table bytes per task (KB)", ("one_runner", "table_bytes_per_task"), True),
]


def _run(cmd: list[str], env: dict[str, str]) -> dict[str, Any]:
    out = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return json.loads(out.stdout[out.stdout.index("{") :])


def _figure(run: dict[str, Any], path: tuple[str, str]) -> float:
    raw = run[path[0]].get(path[1])
    if raw is None:  # not measured (the database's CPU when it runs on another machine)
        return float("nan")
    value = float(raw)
    return value / 1000 if "bytes" in path[1] else value  # KB


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    med = {
        name: {label: statistics.median(_figure(r, path) for r in rs) for label, path, _ in FIGURES}
        for name, rs in runs.items()
    }
    out: dict[str, Any] = {"medians": med, "runs": {k: len(v) for k, v in runs.items()}}
    if "langgraph" in med:
        out["ratio_to_langgraph"] = {
            name: {label: m[label] / med["langgraph"][label] for label in m if med["langgraph"][label]}
            for name, m in med.items()
            if name != "langgraph"
        }
    out["load_avg_1m"] = {
        name: [round(r["load_avg_1m_at_start"], 2) for r in rs] for name, rs in runs.items()
    }
    return out


def plot(summary: dict[str, Any], path: str) -> None:
    """One row of bars per figure, one bar per system, each row scaled to its own largest."""
    from PIL import Image, ImageDraw

    med = summary["medians"]
    systems = list(med)
    colours = [(70, 110, 180), (150, 150, 150), (200, 120, 60)]
    bar_h, label_w, width = 14, 210, 860
    height = 30 + len(FIGURES) * (len(systems) * bar_h + 14)
    img = Image.new("RGB", (width, height), "white")
    d = ImageDraw.Draw(img)
    for i, name in enumerate(systems):
        d.rectangle([10 + 150 * i, 8, 20 + 150 * i, 18], fill=colours[i % 3])
        d.text((24 + 150 * i, 7), name, fill="black")
    y = 30
    for label, _path, lower in FIGURES:
        d.text((10, y + 2), label + (" (lower better)" if lower else ""), fill="black")
        top = max(med[s][label] for s in systems) or 1.0
        for i, s in enumerate(systems):
            v = med[s][label]
            x1 = label_w + (width - label_w - 80) * v / top
            d.rectangle([label_w, y, max(x1, label_w + 1), y + bar_h - 3], fill=colours[i % 3])
            d.text((x1 + 4, y), f"{v:,.0f}" if v >= 100 else f"{v:.3g}", fill="black")
            y += bar_h
        y += 14
    img.save(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--langgraph-python", help="python of a venv with requirements/bench-langgraph.txt")
    ap.add_argument("--before", help="an older dayzero checkout, measured with this accounting too")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=40)
    ap.add_argument("--out")
    ap.add_argument("--plot")
    args = ap.parse_args()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    ours = [sys.executable, "-P", "-m", "benchmarks.orchestrator_overhead", "--tasks", str(args.tasks)]
    systems: dict[str, tuple[list[str], dict[str, str]]] = {
        "dayzero": (ours, {**env, "PYTHONPATH": str(REPO)})
    }
    if args.before:
        systems["dayzero before"] = (ours, {**env, "PYTHONPATH": os.pathsep.join([args.before, str(REPO)])})
    if args.langgraph_python:
        lg = [args.langgraph_python, "-m", "benchmarks.langgraph_side_by_side", "--tasks", str(args.tasks)]
        systems["langgraph"] = (lg, env)
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    with Progress() as progress:
        bar = progress.add_task("interleaved runs", total=args.repeats * len(systems))
        for _ in range(args.repeats):
            for name, (cmd, e) in systems.items():
                runs[name].append(_run(cmd, e))
                progress.advance(bar)
    summary = summarise(runs)
    summary["raw"] = runs
    text = json.dumps(summary, indent=2)
    if args.out:
        Path(args.out).write_text(text)
    if args.plot:
        plot(summary, args.plot)
    print(json.dumps({k: v for k, v in summary.items() if k != "raw"}, indent=2))


if __name__ == "__main__":
    main()

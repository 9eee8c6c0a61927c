"""Demo model eval: held-out paraphrase families run through `dayzero run`, per category.

Each task comes from a family the model was never trained on (`training.demo_model.corpus`:
other wordings of its skills) and runs as `dayzero run "<question>" [--image FILE]` runs it: the
same submission code, a local runner with SQLite and in-process tools, the embedded engine on the
CPU, greedy; images and PDFs are real files attached as `--image` attaches them. Per category:
task success (status SUCCEEDED, the expected values in the answer, the expected tool or none),
the share of tool calls that parsed and matched their schema, and answers holding a special token.
Targets: success >= 90% overall and in each category, 100% valid calls, no special tokens.

    python -m benchmarks.demo_eval                                  # 20 tasks per category, the bundled model
    python -m benchmarks.demo_eval --per-category 30 --workers 2 --model-dir DIR --out result.json
    python -m benchmarks.demo_eval --categories image,document
    python -m benchmarks.demo_eval --out after.json --baseline before.json --chart success.png

Results: `docs/results/demo_eval_*.json` (this script's `--out`; `checkpoint` is the SHA-256 of the
measured checkpoint's `model.safetensors.index.json`) and `--chart` PNGs. The full stack (REST + runner + Celery + `dayzero infer serve`) runs the same tasks
in `benchmarks/demo_eval_stack.py`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    from inference.demo_model.spec import DEMO_DIR
    from training.demo_model.corpus import CATEGORIES
    from training.demo_model.evaluate import evaluate

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model-dir", type=Path, default=DEMO_DIR)
    p.add_argument("--per-category", type=int, default=20)
    p.add_argument("--categories", default=",".join(CATEGORIES))
    p.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument("--out", type=Path, default=None, help="also write the summary and every outcome here")
    p.add_argument("--show-failures", type=int, default=10)
    p.add_argument("--chart", type=Path, default=None, help="draw per-category success here (PNG)")
    p.add_argument("--baseline", type=Path, default=None, help="an earlier --out file drawn beside this run")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    cats = tuple(c for c in args.categories.split(",") if c)
    summary, outcomes = evaluate(args.model_dir, args.per_category, args.workers, categories=cats)
    summary["wall_s"] = round(time.perf_counter() - t0, 1)
    summary["machine"] = {"cpus": os.cpu_count(), "workers": args.workers}
    summary["model_dir"] = str(args.model_dir)
    summary["checkpoint"] = hashlib.sha256(
        (args.model_dir / "model.safetensors.index.json").read_bytes()
    ).hexdigest()
    print(json.dumps(summary, indent=2))
    for o in [o for o in outcomes if not o.success][: args.show_failures]:
        print(
            json.dumps({"category": o.category, "answer": o.answer, "problems": o.problems}), file=sys.stderr
        )
    if args.chart:
        from training.demo_model.plot import save_success_bars

        runs = {}
        if args.baseline:
            runs[f"baseline ({args.baseline.name})"] = json.loads(args.baseline.read_text())["summary"]
        runs[str(args.model_dir)[-40:]] = summary
        save_success_bars(runs, args.chart)
    if args.out:
        args.out.write_text(
            json.dumps({"summary": summary, "outcomes": [asdict(o) for o in outcomes]}, indent=1) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

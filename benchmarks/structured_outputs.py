"""Structured outputs: the share of answers that validate, and grammar compile time per schema.

Every schema of the corpus (`testing/structured/schemas/`, 241 tool and answer shapes)
asked as `response_format` (json_schema, strict), as a required tool's and a named tool's
arguments, whole and streamed, through `dayzero infer serve` and the official `openai` SDK, with
the bundled demo model and a random-weight `--dummy` model; each answer validated with jsonschema
(Draft 2020-12, formats checked). Schemas the grammar cannot express must be refused (400).

    python -m benchmarks.structured_outputs                      # the whole matrix, JSON to stdout
    python -m benchmarks.structured_outputs --models dayzero-small-random --modes response_format --out r.json

Results: JSON on stdout (and `--out`); a run worth keeping goes to `docs/results/`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

MODELS = {"dayzero-small-random": ["--dummy"], "dayzero-demo": ["--model", "inference/demo_model/weights"]}


def compile_times() -> dict[str, float]:
    """Seconds to check and compile each supported schema's grammar (cold cache)."""
    import llguidance

    from inference.structured.grammar import schema_error, with_options
    from inference.tokenizer import ByteTokenizer
    from testing.structured.corpus import load_corpus

    tok = ByteTokenizer().grammar_tokenizer()
    times = []
    for e in load_corpus():
        t0 = time.perf_counter()
        text = json.dumps(with_options(e.schema))
        if schema_error(text) is None:
            m = llguidance.LLMatcher(tok, llguidance.LLMatcher.grammar_from_json_schema(text), log_level=0)
            m.compute_ff_tokens()  # the first mask is where a lazy lexer does its work
            times.append(time.perf_counter() - t0)
    times.sort()
    return {
        "schemas": len(times),
        "mean_ms": round(1000 * statistics.fmean(times), 3),
        "p50_ms": round(1000 * times[len(times) // 2], 3),
        "p99_ms": round(1000 * times[int(len(times) * 0.99)], 3),
        "max_ms": round(1000 * times[-1], 3),
    }


def main() -> int:
    from testing.inference_server import served
    from testing.structured import conformance
    from testing.structured.corpus import SUPPORT_FILE, load_corpus

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--modes", default="response_format,tool_required,tool_named")
    ap.add_argument("--limit", type=int, default=0, help="first N schemas only (0: all)")
    ap.add_argument("--max-tokens", type=int, default=1024)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    refused = {n for n, s in json.loads(SUPPORT_FILE.read_text()).items() if not s["compiles"]}
    entries = [e for e in load_corpus() if e.name not in refused]
    if args.limit:
        entries = entries[: args.limit]
    modes = args.modes.split(",")
    result: dict = {"compile": compile_times(), "models": {}}
    for model in args.models.split(","):
        cases = [
            conformance.Case(e, m, s)
            for e in entries
            for m in modes
            if m in ("response_format", "json_object") or conformance.tool_mode_fits(e.schema)
            for s in (False, True)
        ]
        t0 = time.perf_counter()
        with served([*MODELS[model], "--max-num-seqs", "16"]) as url:
            outcomes = conformance.run(url, model, cases, max_tokens=args.max_tokens)
        per_mode = {}
        for m in modes:
            for s in (False, True):
                got = [o for o in outcomes if o.case.mode == m and o.case.stream == s]
                valid = sum(o.error is None for o in got)
                per_mode[f"{m}{'_stream' if s else ''}"] = {
                    "answers": len(got),
                    "valid": valid,
                    "valid_pct": round(100 * valid / len(got), 2),
                }
        bad = [
            {
                "schema": o.case.entry.name,
                "mode": o.case.mode,
                "stream": o.case.stream,
                "finish": o.finish_reason,
                "error": o.error,
            }
            for o in outcomes
            if o.error
        ]
        valid = sum(o.error is None for o in outcomes)
        result["models"][model] = {
            "answers": len(outcomes),
            "valid": valid,
            "valid_pct": round(100 * valid / len(outcomes), 2),
            "seconds": round(time.perf_counter() - t0, 1),
            "mean_completion_tokens": round(statistics.fmean(o.completion_tokens for o in outcomes), 1),
            "per_mode": per_mode,
            "invalid": bad,
        }
        print(
            json.dumps({model: {k: v for k, v in result["models"][model].items() if k != "invalid"}}),
            file=sys.stderr,
        )
    text = json.dumps(result, indent=1)
    if args.out:
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CLI commands of the inference package. Must not import torch at import time."""

from __future__ import annotations

import argparse
import json
import sys


def register(sub: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `dayzero` parser."""
    p = sub.add_parser(
        "analyze",
        help="structure-first analysis of a model config (operators, parameters, memory, parallel plan)",
        description="Parse a Hugging Face config.json (kimi_linear, +DSA, +vision) and print its operator "
        "inventory, total/active parameters, weight bytes, KV/state bytes and a TP/EP/PP plan.",
    )
    p.add_argument("config", help="path to config.json (or a folder holding one)")
    p.add_argument(
        "--gpus", type=int, default=None, help="GPU count to plan for (default: smallest that fits)"
    )
    p.add_argument("--gpu-mem", type=float, default=80.0, help="memory per GPU in GiB (default 80)")
    p.add_argument("--context", type=int, default=131072, help="tokens per sequence (default 131072)")
    p.add_argument("--sequences", type=int, default=1, help="concurrent sequences the plan must hold")
    p.add_argument(
        "--weights", choices=("bf16", "fp8", "fp4"), default="bf16", help="weight precision for the plan"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_analyze)
    _register_infer(sub)


def _analyze(args: argparse.Namespace) -> int:
    # Lazy imports: the CLI starts without loading model code (analysis itself is torch-free).
    from inference.analyze import analyze, format_analysis, to_json
    from inference.config import ConfigError, load_config

    try:
        spec = load_config(args.config)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for name, value in (("--gpus", args.gpus), ("--context", args.context), ("--sequences", args.sequences)):
        if value is not None and value <= 0:
            print(f"error: {name} must be positive", file=sys.stderr)
            return 2
    result = analyze(
        spec, gpus=args.gpus, gpu_mem_gib=args.gpu_mem, context=args.context, weight_dtype=args.weights,
        sequences=args.sequences,
    )  # fmt: skip
    print(json.dumps(to_json(result), indent=2) if args.json else format_analysis(result))
    if result.plan is None or not result.plan.fits:
        return 1
    return 0


def _register_infer(sub: argparse._SubParsersAction) -> None:
    """`dayzero infer serve` (the engine's OpenAI-compatible server); torch loads only when it runs."""
    from inference.server.cli import register_infer

    register_infer(sub)

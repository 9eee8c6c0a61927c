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
        description="Parse a Hugging Face config.json (kimi_linear, deepseek_v3/v32, kimi_k2, kimi_k25, "
        "qwen3_next) and print its operator inventory, total/active parameters, weight bytes, KV/state bytes "
        "and a TP/EP/PP plan; with --diff A B, what B needs that A does not have.",
    )
    p.add_argument("config", nargs="?", help="path to config.json (or a folder holding one)")
    p.add_argument(
        "--diff",
        nargs=2,
        metavar=("A", "B"),
        help="list operators and shapes present in config B but not in A, and the memory consequences",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=None,
        help="most GPUs to use (the plan takes the fewest that fit; default 1024)",
    )
    p.add_argument("--gpu-mem", type=float, default=80.0, help="memory per GPU in GiB (default: %(default)s)")
    p.add_argument("--context", type=int, default=131072, help="tokens per sequence (default: %(default)s)")
    p.add_argument(
        "--sequences",
        type=int,
        default=1,
        help="concurrent sequences the plan must hold (default: %(default)s)",
    )
    p.add_argument(
        "--weights",
        choices=("bf16", "fp8", "int4", "fp4"),
        default=None,
        help="weight precision for the plan (default: the checkpoint's quantization_config, else bf16)",
    )
    p.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="also plan hosts of this many GPUs: TP x EP inside a host, one pipeline stage per host "
        "(the stage plan the runtime uses), and say how many hosts",
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p.set_defaults(func=_analyze)
    _register_infer(sub)
    _register_node(sub)


def _analyze(args: argparse.Namespace) -> int:
    # Lazy imports: the CLI starts without loading model code (analysis itself is torch-free).
    from inference.analyze import analyze, diff, format_analysis, format_diff, to_json
    from inference.config import ConfigError, load_config

    if (args.config is None) == (args.diff is None):
        print("error: give either CONFIG or --diff A B", file=sys.stderr)
        return 2
    try:
        specs = [load_config(p) for p in (args.diff or [args.config])]
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        if args.diff:
            d = diff(*specs, context=args.context)
            print(json.dumps(to_json(d), indent=2) if args.json else format_diff(d))
            return 0
        result = analyze(
            specs[0], gpus=args.gpus, gpu_mem_gib=args.gpu_mem, context=args.context, weight_dtype=args.weights,
            sequences=args.sequences, gpus_per_node=args.gpus_per_node,
        )  # fmt: skip
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    serving = serving_report(args.config)
    if args.json:
        print(json.dumps({**to_json(result), **({"serving": serving} if serving else {})}, indent=2))
    else:
        print(format_analysis(result))
        if serving:
            print("\nserving (from the checkpoint's files):")
            print("\n".join(f"  {k:<18} {v}" for k, v in serving.items()))
    if result.plan is None or not result.plan.fits:
        return 1
    if args.gpus_per_node and (result.nodes is None or not result.nodes.fits):
        return 1
    return 0


def serving_report(path: str | None) -> dict[str, str] | None:
    """What `dayzero infer serve` would use of a checkpoint folder: its tokenizer, chat template
    and parsers (None for a lone config.json); a file that would be refused is reported as such."""
    from pathlib import Path

    from inference.chat import load_frontend
    from inference.tokenizer import TokenizerFilesError, load_tokenizer

    if path is None or not Path(path).is_dir():
        return None
    try:
        return load_frontend(load_tokenizer(path), path).describe()
    except TokenizerFilesError as exc:
        return {"refused": str(exc)}


def _register_node(sub: argparse._SubParsersAction) -> None:
    """`dayzero infer-node`: a host other than node 0 of a multi-node engine (spawns its ranks)."""
    from inference.parallel.cluster import add_cluster_arguments

    p = sub.add_parser(
        "infer-node",
        help="run this host's part of a multi-node engine: node 0 the driver command, the others their ranks",
        description="On node 0, runs the driver command given after the flags (`infer serve ...`, "
        "which reads the same rendezvous settings from the environment). On any other node, connects "
        "to node 0's driver (MASTER_ADDR, MASTER_PORT + 1; shared secret DAYZERO_CLUSTER_KEY), receives "
        "the model and layout, spawns this node's ranks and reports their exits; stops them when the "
        "driver goes. One command for every pod of a StatefulSet.",
    )
    add_cluster_arguments(p, pipeline=False)
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for the driver (default: %(default)s)",
    )
    p.add_argument(
        "--health-port", type=int, default=None,
        help="serve GET /health on this port on nodes other than 0 (200 while their ranks run)",
    )  # fmt: skip
    p.add_argument("driver", nargs=argparse.REMAINDER, help="node 0's command, e.g. infer serve --model ...")
    p.set_defaults(func=_infer_node)


def _infer_node(args: argparse.Namespace) -> int:
    import logging

    from inference.parallel.cluster import cluster_from_args, node_main
    from inference.parallel.config import ParallelConfigError

    try:
        cluster = cluster_from_args(args)
    except ParallelConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if cluster.node_rank == 0:  # the driver: its command, in this process
        driver = args.driver[1:] if args.driver[:1] == ["--"] else args.driver
        if not driver:
            print("error: node 0 runs the driver: give its command (infer serve ...)", file=sys.stderr)
            return 2
        parser = argparse.ArgumentParser(prog="dayzero")
        register(parser.add_subparsers(dest="command", required=True))
        driver_args = parser.parse_args(driver)
        return driver_args.func(driver_args)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return node_main(cluster, connect_timeout_s=args.connect_timeout, health_port=args.health_port)
    except ParallelConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _register_infer(sub: argparse._SubParsersAction) -> None:
    """`dayzero infer serve` (the engine's OpenAI-compatible server); torch loads only when it runs."""
    from inference.server.cli import register_infer

    register_infer(sub)

"""CLI commands of this package: `dayzero worker`. Must not import torch at import time."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

QUEUES = ("preprocess", "tools")


def register(sub: argparse._SubParsersAction) -> None:
    """Add this package's sub-commands to the `dayzero` parser."""
    p = sub.add_parser(
        "worker",
        help="run a Celery worker for the preprocess and/or tools queues",
        description="Run a Celery worker. Broker and result backend come from CELERY_BROKER_URL and "
        "CELERY_RESULT_BACKEND. Scale each queue separately by running workers with different --queues.",
    )
    p.add_argument(
        "--queues",
        "-Q",
        default="preprocess",
        help="comma-separated, from: " + ", ".join(QUEUES) + " (default: %(default)s)",
    )
    p.add_argument(
        "--concurrency", "-c", type=int, default=None, help="worker processes (default: CPU count)"
    )
    p.add_argument(
        "--pool",
        default="prefork",
        choices=("prefork", "solo", "threads"),
        help="Celery pool (default: %(default)s)",
    )
    p.add_argument("--loglevel", "-l", default="INFO", help="Celery log level (default: %(default)s)")
    p.add_argument("--hostname", "-n", default=None, help="node name (default: celery's)")
    p.add_argument(
        "--max-tasks-per-child",
        type=int,
        default=None,
        help="restart a pool process after this many jobs (default: never)",
    )
    p.add_argument("--metrics-port", type=int, default=None, help="serve Prometheus /metrics on this port")
    p.set_defaults(func=run_worker)


def worker_argv(args: argparse.Namespace) -> list[str]:
    """The `celery worker` argument list for these options (validates the queue names)."""
    queues = [q.strip() for q in str(args.queues).split(",") if q.strip()]
    unknown = sorted(set(queues) - set(QUEUES))
    if not queues or unknown:
        raise SystemExit(
            f"dayzero worker: unknown queue(s) {unknown or queues}; choose from {', '.join(QUEUES)}"
        )
    argv = ["worker", "--queues", ",".join(queues), "--pool", args.pool, "--loglevel", args.loglevel]
    if args.concurrency is not None:
        if args.concurrency < 1:
            raise SystemExit("dayzero worker: --concurrency must be >= 1")
        argv += ["--concurrency", str(args.concurrency)]
    if args.hostname:
        argv += ["--hostname", args.hostname]
    if args.max_tasks_per_child:
        argv += ["--max-tasks-per-child", str(args.max_tasks_per_child)]
    return argv


def serve_metrics(port: int, app: Any, queues: list[str]) -> None:
    """/metrics of every pool process (prometheus_client's multiprocess mode, whose directory must
    be set before prometheus_client is first imported: the children inherit it), plus the depth
    of the queues this worker consumes, asked of the broker at scrape time."""
    if not os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        raise RuntimeError("set PROMETHEUS_MULTIPROC_DIR before prometheus_client is imported")
    from prometheus_client import CollectorRegistry, start_http_server
    from prometheus_client.multiprocess import MultiProcessCollector

    from workers.metrics import QueueDepthCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    registry.register(QueueDepthCollector(app, queues))
    start_http_server(port, registry=registry)


def run_worker(args: argparse.Namespace) -> int:
    broker = os.environ.get("CELERY_BROKER_URL")
    if not broker:
        print("dayzero worker: set CELERY_BROKER_URL (e.g. a redis:// or amqp:// URL)", file=sys.stderr)
        return 2
    argv = worker_argv(args)
    if args.metrics_port is not None:
        os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="dayzero-worker-metrics-"))
    from workers.celery_app import make_celery_app

    vt = os.environ.get("DAYZERO_CELERY_VISIBILITY_TIMEOUT_S")
    app = make_celery_app(
        broker, os.environ.get("CELERY_RESULT_BACKEND"), visibility_timeout_s=float(vt) if vt else None
    )
    if args.metrics_port is not None:
        serve_metrics(args.metrics_port, app, argv[argv.index("--queues") + 1].split(","))
    app.worker_main(argv)
    return 0

"""`dayzero runner`: a long-running worker that executes task steps."""

from __future__ import annotations

import argparse
import logging

from orchestrator.commands.kafka_process import add_probe_arguments
from orchestrator.commands.signals import hand_over, stop_on_signals


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("runner", help="run task steps until stopped (SIGTERM/SIGINT stop at a step boundary)")
    p.add_argument("--id", default=None, help="runner id (default: random)")
    p.add_argument("--upgrade", action="store_true", help="apply migrations first")
    add_probe_arguments(p)
    p.set_defaults(func=_runner)


def _runner(args: argparse.Namespace) -> int:
    from orchestrator import logs
    from orchestrator.app import make_runner
    from orchestrator.config import Settings

    logs.setup(logging.INFO)  # one logfmt line per record, written off the loop's thread
    from orchestrator.probes import retry_until_up
    from orchestrator.tracing import setup_tracing

    settings = Settings()
    setup_tracing("dayzero-runner", settings.otlp_endpoint)
    stop = stop_on_signals()
    # Started during a database outage, it waits for the database (its loop then retries too).
    parts = retry_until_up(
        "connecting to the database",
        lambda: make_runner(settings, upgrade=args.upgrade, runner_id=args.id),
        stop,
    )
    hand_over(stop, parts.runner.stop)
    if args.metrics_port is not None:
        from orchestrator.probes import serve_probes

        serve_probes(args.metrics_host, args.metrics_port, parts.runner.health)
    logging.getLogger("dayzero").info("runner %s started", parts.runner.config.runner_id)
    try:
        parts.runner.run_forever()
    finally:
        parts.close()
        logging.getLogger("dayzero").info("runner %s stopped", parts.runner.config.runner_id)
    return 0

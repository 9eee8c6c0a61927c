"""`dayzero serve`: the REST API (uvicorn)."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the REST API (tasks, attachments, live events, metrics)")
    p.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to bind; 0.0.0.0 for every interface (default: %(default)s)",
    )
    p.add_argument(
        "--port", type=int, default=8000, help="TCP port of the API, /ui and /metrics (default: %(default)s)"
    )
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes (default: %(default)s)")
    p.add_argument("--upgrade", action="store_true", help="apply migrations first")
    p.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="server and access log level; warning and above silence the access log (default: %(default)s)",
    )
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from orchestrator.api.server import TcpConfig
    from orchestrator.app import make_db
    from orchestrator.config import Settings
    from orchestrator.logs import uvicorn_log_config

    make_db(Settings(), upgrade=args.upgrade).dispose()  # fail fast on a schema that is behind
    config = TcpConfig(
        "orchestrator.api.app:create_app",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        log_config=uvicorn_log_config(args.log_level),
        access_log=False,  # uvicorn's own; ours is `dayzero.access` (orchestrator.api.access_log)
    )
    server = uvicorn.Server(config)
    if args.workers == 1:
        server.run()
    else:
        from uvicorn.supervisors import Multiprocess

        Multiprocess(config, sockets=[config.bind_socket()]).run()
    return 0

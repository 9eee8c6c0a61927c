"""`dayzero db upgrade|current|downgrade`."""

from __future__ import annotations

import argparse

from rich.console import Console

from orchestrator.config import Settings


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("db", help="database schema migrations")
    dbsub = p.add_subparsers(dest="db_command", required=True)
    up = dbsub.add_parser("upgrade", help="apply migrations (default: to head)")
    up.add_argument("revision", nargs="?", default="head", help="target revision (default: %(default)s)")
    up.set_defaults(func=_upgrade)
    cur = dbsub.add_parser("current", help="print the applied and the head revision")
    cur.set_defaults(func=_current)
    down = dbsub.add_parser("downgrade", help="revert migrations to REVISION")
    down.add_argument("revision", help="revision to revert to (`dayzero db current` lists them)")
    down.set_defaults(func=_downgrade)


def _upgrade(args: argparse.Namespace) -> int:
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    settings = Settings()
    engine = make_engine(settings.database_url)
    console = Console(stderr=True)
    with console.status(f"migrating {engine.url.render_as_string(hide_password=True)} to {args.revision}"):
        migrate.upgrade(engine, args.revision)
    console.print(f"database at revision {migrate.current_revision(engine)}")
    return 0


def _current(args: argparse.Namespace) -> int:
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    engine = make_engine(Settings().database_url)
    print(f"current: {migrate.current_revision(engine)}  head: {migrate.head_revision()}")
    return 0 if migrate.is_up_to_date(engine) else 1


def _downgrade(args: argparse.Namespace) -> int:
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    migrate.downgrade(make_engine(Settings().database_url), args.revision)
    return 0

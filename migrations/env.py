"""Alembic environment. Used programmatically by `dayzero db upgrade` (a connection is passed in
`config.attributes["connection"]`) or by the `alembic` CLI with `DATABASE_URL` set."""

from __future__ import annotations

import os

from alembic import context

from orchestrator.db.engine import make_engine
from orchestrator.db.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    url = os.environ.get("DATABASE_URL", "sqlite:///./dayzero.db")
    engine = make_engine(url)
    with engine.connect() as conn:
        _run(conn)
    engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline (SQL script) mode is not supported; run `dayzero db upgrade`")
run_migrations_online()

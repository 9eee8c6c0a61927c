"""A real PostgreSQL outage for one test database: new connections refused, open ones killed."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from orchestrator.db.engine import make_engine
from testing.postgres import PG_ADMIN_URL


def cut_connections(dbname: str) -> int:
    """Terminate every session of `dbname` (what a failover or a network cut does to them)."""
    admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            return conn.exec_driver_sql(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                f"WHERE datname = '{dbname}' AND pid <> pg_backend_pid()"
            ).scalar_one()
    finally:
        admin.dispose()


@contextmanager
def database_down(dbname: str) -> Iterator[None]:
    """While inside: `dbname` refuses connections and every open one is cut."""
    admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS false')
        cut_connections(dbname)
        yield
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'ALTER DATABASE "{dbname}" ALLOW_CONNECTIONS true')
        admin.dispose()

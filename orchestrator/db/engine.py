"""Engine construction for PostgreSQL (psycopg 3) and SQLite.

SQLite: WAL journal, a busy timeout, and `BEGIN IMMEDIATE` for every transaction, so a claim
(`SELECT … then UPDATE`) holds the single write lock from its first statement — the SQLite stand-in
for `FOR UPDATE SKIP LOCKED`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, DisconnectionError
from sqlalchemy.exc import TimeoutError as PoolTimeout

# The database's errors; `core.outage.is_outage` says which of them mean it cannot be reached
# (down, restarting, connections cut, pool exhausted: wait and retry, or answer 503).
DB_ERRORS: tuple[type[Exception], ...] = (DBAPIError, DisconnectionError, PoolTimeout)


def normalize_url(url: str) -> str:
    """Pick the psycopg 3 driver for plain `postgresql://` URLs."""
    u = make_url(url)
    if u.drivername in ("postgresql", "postgres"):
        u = u.set(drivername="postgresql+psycopg")
    return u.render_as_string(hide_password=False)


def make_engine(url: str, **kwargs: Any) -> Engine:
    """Create an engine with the settings this service relies on."""
    url = normalize_url(url)
    if url.startswith("sqlite"):
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)

        @event.listens_for(engine, "connect")
        def _on_connect(dbapi_conn: Any, _record: Any) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.close()

        @event.listens_for(engine, "begin")
        def _on_begin(conn: Any) -> None:
            conn.exec_driver_sql("BEGIN IMMEDIATE")

        return engine
    kwargs.setdefault("pool_pre_ping", True)
    kwargs.setdefault("pool_size", 5)
    return create_engine(url, **kwargs)


@contextmanager
def autocommit_driver(conn: Connection, sql: str, params: Any) -> Iterator[Any]:
    """The psycopg connection under `conn` (not in a transaction), in autocommit mode while the
    block runs: for statements that are a transaction of their own, or carry their own BEGIN and
    COMMIT, so that no separate round trip begins or ends one. The runner's hot paths use it
    (`tasks.writer`, `runner.lease`); SQLAlchemy's statement machinery is bypassed there, so the
    driver's errors are raised as SQLAlchemy's (what `core.outage.is_outage` and the callers
    catch), and a broken connection is invalidated so that the pool does not hand it out again.
    `sql` and `params` only label those errors."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    dbapi = conn.connection.driver_connection
    try:
        dbapi.autocommit = True
        try:
            yield dbapi
        finally:
            if not dbapi.broken:
                dbapi.autocommit = False
    except psycopg.Error as exc:
        broken = dbapi.broken
        if broken:
            conn.invalidate(exc)
        raise DBAPIError.instance(sql, params, exc, psycopg.Error, connection_invalidated=broken) from exc

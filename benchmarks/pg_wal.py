"""WAL and table-size accounting of one PostgreSQL database, shared by the orchestrator
benchmarks so that dayzero and LangGraph are counted by the same rule (psycopg only: the
LangGraph venv has neither SQLAlchemy nor dayzero).

A database's WAL between two LSNs is every record of a transaction that wrote one of its
relations (pg_walinspect), commit records included; other databases' writes are left out.
`conninfo`: a libpq connection string or URL (a SQLAlchemy `postgresql+psycopg://` URL works).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from typing import Any

import psycopg

_RECORDS = (
    "WITH r AS (SELECT xid, record_length, fpi_length, block_ref, "
    "substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)') AS node FROM pg_get_wal_records_info("
    "'0/0'::pg_lsn + %(a)s::numeric, '0/0'::pg_lsn + %(b)s::numeric)), "
    "ours AS (SELECT DISTINCT xid FROM r WHERE xid <> '0' AND block_ref LIKE %(rel)s) "
)


@contextmanager
def _connect(conninfo: str) -> Any:
    with psycopg.connect(conninfo.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        yield conn


def _params(conn: Any, start_lsn: int, end_lsn: int) -> dict[str, Any]:
    conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
    (oid,) = conn.execute("SELECT oid FROM pg_database WHERE datname = current_database()").fetchone()
    return {"a": start_lsn, "b": end_lsn, "rel": f"%/{oid}/%"}


def lsn_and_table_bytes(conninfo: str) -> tuple[int, int]:
    """(the current WAL position, the bytes of the public schema's tables with their indexes)."""
    with _connect(conninfo) as conn:
        (lsn,) = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()
        (size,) = conn.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind = 'r'"
        ).fetchone()
    return int(lsn), int(size)


def record_bytes(conninfo: str, start_lsn: int, end_lsn: int) -> tuple[int, int]:
    """(record bytes without full-page images, full-page-image bytes) of this database's WAL."""
    with _connect(conninfo) as conn:
        rec, fpi = conn.execute(
            _RECORDS + "SELECT sum(record_length - fpi_length), sum(fpi_length) FROM r "
            "WHERE xid IN (SELECT xid FROM ours)",
            _params(conn, start_lsn, end_lsn),
        ).fetchone()
    return int(rec or 0), int(fpi or 0)


def record_bytes_by_relation(conninfo: str, start_lsn: int, end_lsn: int) -> dict[str, int]:
    """This database's WAL record bytes by relation (a record counts for the first block it
    touches), largest first; records without a block (commits) are "(no block: commit)"."""
    with _connect(conninfo) as conn:
        rows = conn.execute(
            _RECORDS
            + "SELECT coalesce(c.relname, '(no block: commit)'), sum(r.record_length - r.fpi_length) "
            "FROM r LEFT JOIN pg_class c ON c.relfilenode::text = r.node "
            "WHERE r.xid IN (SELECT xid FROM ours) GROUP BY 1 ORDER BY 2 DESC",
            _params(conn, start_lsn, end_lsn),
        ).fetchall()
    return {name: int(n) for name, n in rows}


def server_cpu_seconds(conninfo: str) -> float | None:
    """CPU seconds the PostgreSQL server has used so far, all its processes together (backends,
    WAL writer, checkpointer, autovacuum; backends that exited are in the postmaster's reaped
    children's time), read from /proc: the server must run on this machine (None otherwise).
    The difference over a phase is the database's side of its cost, which a latency does not show
    when client and server share the CPUs."""
    with _connect(conninfo) as conn:
        (backend,) = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        postmaster = int(_proc_stat(backend)[1])  # a backend's parent is the postmaster
        tick = os.sysconf("SC_CLK_TCK")
        fields = _proc_stat(postmaster)
        ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) != backend:
                try:
                    child = _proc_stat(int(entry))
                except OSError:
                    continue  # exited meanwhile
                if int(child[1]) == postmaster:
                    ticks += int(child[11]) + int(child[12])
    except OSError:
        return None
    return ticks / tick


def cpu_between(start_s: float | None, end_s: float | None) -> float | None:
    """The server's CPU seconds between two `server_cpu_seconds` readings (None if either is)."""
    return None if start_s is None or end_s is None else end_s - start_s


def cpu_per_step(runner_cpu_s: float, db_cpu_s: float | None, steps: int) -> dict[str, float | None]:
    """The CPU figures of a phase, per step: the runners' (their processes' CPU), the database's
    (`server_cpu_seconds` over the phase; None when not measured), their sum, and the throughput
    this machine's CPUs allow at that cost had runners and database all of them and nothing else
    (the ceiling on this box: 3,000 steps/s on 2 cores needs the sum at or below 0.67 ms)."""
    runner = 1000 * runner_cpu_s / steps
    db = None if db_cpu_s is None else 1000 * db_cpu_s / steps
    return {
        "runner_cpu_ms_per_step": runner,
        "db_cpu_ms_per_step": db,
        "cpu_ms_per_step": None if db is None else runner + db,
        "cpu_bound_steps_per_s": None if db is None else 1000 * (os.cpu_count() or 1) / (runner + db),
    }


def _proc_stat(pid: int) -> list[str]:
    """/proc/<pid>/stat's fields after the command name (field 3, the state, is index 0)."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()

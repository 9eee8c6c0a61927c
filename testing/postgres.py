"""The PostgreSQL server the tests and benchmarks use (`DAYZERO_TEST_PG_URL`, the admin database)."""

from __future__ import annotations

import os

PG_ADMIN_URL = os.environ.get("DAYZERO_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def pg_url(dbname: str) -> str:
    """The URL of another database on the same server."""
    return PG_ADMIN_URL.rsplit("/", 1)[0] + "/" + dbname

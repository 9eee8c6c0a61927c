"""Shared fixtures: real PostgreSQL (a fresh database per test) and SQLite, migrated by Alembic.

The database modules are imported inside the fixtures, so the GPU machine (which has torch and
triton but not the service dependencies) can run `python -m pytest -m gpu tests/inference`."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from sqlalchemy import Engine


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Before any test module imports triton (Triton reads this when a kernel is decorated): without a
# CUDA device the kernel tests run our Triton kernels in its interpreter. The model's dispatch
# (`inference.kernels.use_fast`) ignores it, so everything else keeps the PyTorch references.
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


from testing.postgres import PG_ADMIN_URL  # noqa: E402  (after TRITON_INTERPRET is set)
from testing.postgres import pg_url as _pg_url  # noqa: E402


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database; dropped afterwards. Fails (never skips) without a server."""
    from orchestrator.db.engine import make_engine

    name = f"dz_test_{uuid.uuid4().hex[:10]}"
    admin = make_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield _pg_url(name)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'dayzero.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request) -> str:
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def db(db_url) -> Iterator[Engine]:
    from orchestrator.db import migrate
    from orchestrator.db.engine import make_engine

    engine = make_engine(db_url)
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


def pytest_collection_modifyitems(config, items) -> None:
    """`gpu`-marked tests run only where CUDA is (the H200); elsewhere they are skipped, visibly."""
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="gpu: no CUDA device here (run these on the H200: see README)")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # not `in keywords`: a folder named gpu is one
            item.add_marker(skip)

"""API fixtures: the app on a migrated DB (SQLite and PostgreSQL), keys for two tenants."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from orchestrator.api import create_app
from orchestrator.auth import create_api_key
from orchestrator.config import IngressSettings, Settings


@dataclass
class Api:
    client: TestClient
    engine: Engine
    settings: Settings
    keys: dict[str, str]

    def h(self, tenant: str = "acme", **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.keys[tenant]}", **extra}


def make_keys(engine: Engine, *tenants: str) -> dict[str, str]:
    with engine.begin() as conn:
        return {t: create_api_key(conn, t).key for t in tenants}


@pytest.fixture
def api_settings(db_url, tmp_path) -> Settings:
    return Settings(
        DATABASE_URL=db_url,
        DAYZERO_BLOB_DIR=str(tmp_path / "blobs"),
        DAYZERO_TOOL_MODULES="testing.fixture_tools",
    )


@pytest.fixture
def api(db: Engine, api_settings) -> Iterator[Api]:
    ingress = IngressSettings(
        max_body_bytes=64 * 1024, max_upload_bytes=32 * 1024, sse_poll_s=0.1, gc_freeze=False
    )
    app = create_app(api_settings, engine=db, ingress=ingress)
    keys = make_keys(db, "acme", "globex")
    with TestClient(app) as client:
        yield Api(client, db, api_settings, keys)

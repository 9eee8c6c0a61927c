"""Alembic is the only way the schema changes: the migrated schema must equal the models."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from orchestrator.db import migrate
from orchestrator.db.engine import make_engine
from orchestrator.db.models import Base


def test_migrated_schema_matches_models(db):
    with db.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"compare_type": True, "compare_server_default": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == []
    assert migrate.is_up_to_date(db)


def test_downgrade_to_base_and_back(db_url):
    engine = make_engine(db_url)
    migrate.upgrade(engine)
    migrate.downgrade(engine, "base")
    assert migrate.current_revision(engine) is None
    migrate.upgrade(engine)
    assert migrate.current_revision(engine) == migrate.head_revision()
    engine.dispose()

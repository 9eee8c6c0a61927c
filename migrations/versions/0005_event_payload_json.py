"""events.payload as json text, not jsonb (PostgreSQL)

An outbox payload is written once and read whole (relay, SSE feed); nothing queries inside it.
For these small documents compact JSON text is ~40% smaller than JSONB's binary form, and so is
the WAL of every event insert (~2 KB less per 20-cycle task). SQLite stores JSON as text already.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "events", "payload", type_=sa.JSON(), existing_type=JSONB(), postgresql_using="payload::json"
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.alter_column(
            "events", "payload", type_=JSONB(), existing_type=sa.JSON(), postgresql_using="payload::jsonb"
        )

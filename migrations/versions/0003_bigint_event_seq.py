"""events.seq and tasks.event_seq as BIGINT

The API accepts event ids (SSE `Last-Event-ID`, `after`) up to 10^18, and a comparison of a
32-bit column with a larger id failed instead of finding no rows. BIGINT makes every id the API
accepts a valid position. SQLite's INTEGER is already 64-bit; the batch rewrite is a no-op there.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_COLUMNS = (("events", "seq"), ("tasks", "event_seq"))


def upgrade() -> None:
    for table, column in _COLUMNS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                column, type_=sa.BigInteger(), existing_type=sa.Integer(), existing_nullable=False
            )


def downgrade() -> None:
    for table, column in _COLUMNS:
        with op.batch_alter_table(table) as batch:
            batch.alter_column(
                column, type_=sa.Integer(), existing_type=sa.BigInteger(), existing_nullable=False
            )

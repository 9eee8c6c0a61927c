"""the outbox relay keeps a cursor instead of marking each event published

Until now the relay set `events.published_at` on every row it published, and found the rows to
publish through the partial index `ix_events_unpublished` (`published_at IS NULL`). A column in
an index predicate makes every such update a non-HOT one: a new row version on another page and
a new entry in each of the table's indexes, ~460 B of WAL per event (~21 KB per 20-cycle task,
a third on top of what the runner writes), and each insert paid ~65 B for the partial index.
Now one row of `relay_cursors` holds the relay's low-water mark: every event with a smaller id
is published (or was never committed). The relay publishes in id order from there and moves the
mark past ids it has not seen only once no transaction that could still commit them is running
(`orchestrator.kafka.relay`). The mark starts at the oldest event left unpublished.

SQLite: `events` is rebuilt with AUTOINCREMENT, so that an id is never handed out twice (a plain
INTEGER PRIMARY KEY reuses the largest id after its row is deleted, which would hide the new
row below the mark).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from orchestrator.db.types import UTCDateTime

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_UNPUBLISHED = "published_at IS NULL"


def upgrade() -> None:
    op.create_table(
        "relay_cursors",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("low_water", sa.BigInteger(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name"),
    )
    op.execute(
        "INSERT INTO relay_cursors (name, low_water, updated_at) SELECT 'default', "
        "COALESCE((SELECT min(id) FROM events WHERE published_at IS NULL), "
        "(SELECT COALESCE(max(id), 0) + 1 FROM events)), CURRENT_TIMESTAMP"
    )
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table(
        "events",
        recreate="always" if sqlite else "auto",
        table_kwargs={"sqlite_autoincrement": True} if sqlite else {},
    ) as batch_op:
        batch_op.drop_index("ix_events_unpublished")
        batch_op.drop_column("published_at")


def downgrade() -> None:
    sqlite = op.get_bind().dialect.name == "sqlite"
    with op.batch_alter_table("events", recreate="always" if sqlite else "auto") as batch_op:
        batch_op.add_column(sa.Column("published_at", UTCDateTime(), nullable=True))
    # Below the mark everything was published; above it nothing counts as published.
    op.execute(
        "UPDATE events SET published_at = CURRENT_TIMESTAMP "
        "WHERE id < (SELECT low_water FROM relay_cursors WHERE name = 'default')"
    )
    with op.batch_alter_table("events") as batch_op:
        batch_op.create_index(
            "ix_events_unpublished",
            ["id"],
            unique=False,
            postgresql_where=sa.text(_UNPUBLISHED),
            sqlite_where=sa.text(_UNPUBLISHED),
        )
    op.drop_table("relay_cursors")

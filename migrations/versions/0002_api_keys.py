"""api keys; NOTIFY on new outbox events (live SSE feed on PostgreSQL)

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from orchestrator.db.types import UTCDateTime

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# One NOTIFY per task per inserting statement (a statement-level trigger over the transition
# table), delivered at commit: the SSE feed wakes on committed events only. The payload is the
# task id; listeners re-read the events table, so a lost notification only costs latency.
# Cost: the trigger and the NOTIFY queue lock at commit (measured with benchmarks/orchestrator_overhead.py
# on 2 shared cores: roughly 5-15% fewer runner steps/s, noisy). Without the trigger, SSE still works
# by polling (DAYZERO_INGRESS_SSE_LISTEN=false).
_NOTIFY_FN = """
CREATE OR REPLACE FUNCTION dayzero_notify_events() RETURNS trigger AS $$
BEGIN
  PERFORM pg_notify('dayzero_events', t.task_id) FROM (SELECT DISTINCT task_id FROM new_rows) AS t;
  RETURN NULL;
END;
$$ LANGUAGE plpgsql
"""
_NOTIFY_TRIGGER = """
CREATE TRIGGER events_notify AFTER INSERT ON events
REFERENCING NEW TABLE AS new_rows FOR EACH STATEMENT EXECUTE FUNCTION dayzero_notify_events()
"""


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(length=16), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=False),
        sa.Column("key_hash", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=128), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("revoked_at", UTCDateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.create_index("ix_api_keys_tenant", ["tenant"], unique=False)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(_NOTIFY_FN)
        op.execute(_NOTIFY_TRIGGER)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_notify ON events")
        op.execute("DROP FUNCTION IF EXISTS dayzero_notify_events()")
    with op.batch_alter_table("api_keys", schema=None) as batch_op:
        batch_op.drop_index("ix_api_keys_tenant")
    op.drop_table("api_keys")

"""the SSE feed tails the outbox; no NOTIFY per event

Migration 0002 added a statement-level trigger on `events` that NOTIFYed the task id, to wake
the SSE feed. A transaction that notifies takes PostgreSQL's notification-queue lock before it
commits and holds it through the commit's WAL flush, so every step transaction (each writes an
event) waited for every other runner's commit: 4 runner processes ran 5-18% fewer steps/s with
it (`benchmarks/orchestrator_overhead.py`, two sets of interleaved rounds; the more the box is
loaded, the more), and the database spent 12% more CPU per step.
The feed now reads the outbox past a cursor a few times a second in the API process instead
(`orchestrator.api.feed.OutboxTailFeed`), which costs the writers nothing.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-04
"""

import importlib
from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP TRIGGER IF EXISTS events_notify ON events")
        op.execute("DROP FUNCTION IF EXISTS dayzero_notify_events()")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        m0002 = importlib.import_module("migrations.versions.0002_api_keys")  # the trigger as it was
        op.execute(m0002._NOTIFY_FN)
        op.execute(m0002._NOTIFY_TRIGGER)

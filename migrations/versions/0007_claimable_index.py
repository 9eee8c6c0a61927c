"""ix_tasks_claimable: a partial index over the claimable tasks, in next_run_at order

The claim (`runner.lease`) took the claimable task that has waited longest with
`status = ANY(...) ORDER BY next_run_at LIMIT 1 FOR UPDATE SKIP LOCKED`, which `ix_tasks_claim`
`(status, next_run_at)` cannot serve in that order: every claim scanned and sorted every
claimable task (0.25 ms at 300 queued, growing with the queue). Over this partial index the claim
reads the queue in order and stops at the first task it can lock. A task enters and leaves it
only when its status crosses the claimable set (a few times per task), so the steps' writes
(HOT updates of other columns) do not touch it.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# frozen here (a migration does not follow later code): the claimable statuses of 0007
_WHERE = "status IN ('PREPROCESSING', 'READY', 'RUNNING', 'WAITING')"


def upgrade() -> None:
    with op.batch_alter_table("tasks") as batch_op:
        batch_op.create_index(
            "ix_tasks_claimable",
            ["next_run_at"],
            unique=False,
            postgresql_where=sa.text(_WHERE),
            sqlite_where=sa.text(_WHERE),
        )


def downgrade() -> None:
    with op.batch_alter_table("tasks") as batch_op:
        batch_op.drop_index("ix_tasks_claimable")

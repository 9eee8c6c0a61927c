"""a task's context-window policy: `max_context_tokens` and `context_policy` on its row

Chosen in the task's budget (`fail`: the task fails `context_exceeded` when its prompt would
exceed the cap; `trim_tool_results`: the oldest tool results are trimmed first;
`orchestrator.runner.payloads`). NULL: no cap.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as b:
        b.add_column(sa.Column("max_context_tokens", sa.Integer(), nullable=True))
        b.add_column(sa.Column("context_policy", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as b:
        b.drop_column("context_policy")
        b.drop_column("max_context_tokens")

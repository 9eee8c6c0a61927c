"""a capped task's context-policy state on its row: `context_state`

`{"trimmed": n, "known": [messages, prompt_tokens] | null}`: the trim boundary of
`trim_tool_results` and the previous model turn's (message count, prompt tokens) that bound the
old part of the prompt (`orchestrator.runner.payloads`), written with the model turn that changed
them, so the next claim (another runner, or this one after the task was parked) resumes them
instead of recomputing a different boundary (a prompt-cache miss). NULL: no cap, or not yet.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from orchestrator.db.types import JSONType

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("tasks") as b:
        b.add_column(sa.Column("context_state", JSONType, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("tasks") as b:
        b.drop_column("context_state")

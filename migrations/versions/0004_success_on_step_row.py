"""a step's successful attempt on its step row; step_attempts for failed/lost tries only

Per step the runner wrote an attempt row (plus its primary-key entry) and then updated the step
row anyway: ~15 KB of WAL per 20-cycle task. The successful attempt now lives on the step row
(`runner_id`, `started_at`, `finished_at`, plus the new `resumed` and `usage`), written by the
UPDATE that marks the step SUCCEEDED; `step_attempts` keeps the failed and lost tries.
`tasks.queries.list_attempts` shows both as before. The upgrade moves existing SUCCEEDED
attempt rows onto their steps; the downgrade writes them back.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(JSONB(), "postgresql")

# The attempt row that a SUCCEEDED step's row replaces.
_MATCH = (
    "a.task_id = steps.task_id AND a.step_index = steps.step_index "
    "AND a.attempt = steps.attempt_count AND a.status = 'SUCCEEDED'"
)


def upgrade() -> None:
    with op.batch_alter_table("steps") as batch:
        batch.add_column(sa.Column("resumed", sa.Integer(), server_default=sa.text("0"), nullable=False))
        batch.add_column(sa.Column("usage", _JSON, nullable=True))
    sets = ", ".join(
        f"{col} = (SELECT a.{col} FROM step_attempts a WHERE {_MATCH})"
        for col in ("runner_id", "resumed", "usage", "started_at", "finished_at")
    )
    op.execute(
        f"UPDATE steps SET {sets} WHERE status = 'SUCCEEDED' "
        f"AND EXISTS (SELECT 1 FROM step_attempts a WHERE {_MATCH})"
    )
    op.execute(
        "DELETE FROM step_attempts WHERE status = 'SUCCEEDED' AND EXISTS (SELECT 1 FROM steps "
        "WHERE steps.task_id = step_attempts.task_id AND steps.step_index = step_attempts.step_index "
        "AND steps.attempt_count = step_attempts.attempt AND steps.status = 'SUCCEEDED')"
    )


def downgrade() -> None:
    op.execute(
        "INSERT INTO step_attempts (task_id, step_index, attempt, status, runner_id, resumed, error, "
        "usage, started_at, finished_at) SELECT task_id, step_index, attempt_count, 'SUCCEEDED', "
        "coalesce(runner_id, ''), resumed, NULL, usage, coalesce(started_at, created_at), finished_at "
        "FROM steps WHERE status = 'SUCCEEDED'"
    )
    with op.batch_alter_table("steps") as batch:
        batch.drop_column("usage")
        batch.drop_column("resumed")

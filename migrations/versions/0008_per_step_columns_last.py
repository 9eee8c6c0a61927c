"""the columns each step rewrites last in the `tasks` and `steps` rows; usage as json text (PostgreSQL)

A HOT update logs only the bytes between the first and the last that changed (prefix/suffix
compression of the new tuple). Every step updates its task row (`step_count`, the token
counts, `event_seq`, `lease_until`, `updated_at`) and the row of the step it finishes (`usage`,
`finished_at`, `status`); those columns sat among others that never change (`traceparent`,
`created_at`, the arguments, ...), so each update logged most of the row: ~190 B per task-row
update, 160-250 B per step-row update. Moved to the end, in that order, each update logs only
them. PostgreSQL cannot reorder columns in place: each moved column is added at the end, filled
from the old one, which is dropped, and renamed back (no index or constraint involves them).
`steps.usage` and `step_attempts.usage` become `json` text instead of `jsonb`, as
`events.payload` did in 0005: written once, read whole, and ~40% smaller as compact text (a
model step's usage: ~75 B instead of ~120). The downgrade restores `jsonb` and leaves the order
(column order is not part of the schema's meaning). SQLite keeps its order and its JSON text
(it has no HOT updates or WAL records of this shape).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# (table, [(column, type, constraints)]) in their new order, as declared; frozen here.
_MOVES = (
    (
        "tasks",
        [
            ("step_count", "integer", "NOT NULL DEFAULT 0"),
            ("prompt_tokens", "integer", "NOT NULL DEFAULT 0"),
            ("cached_tokens", "integer", "NOT NULL DEFAULT 0"),
            ("completion_tokens", "integer", "NOT NULL DEFAULT 0"),
            ("event_seq", "bigint", "NOT NULL DEFAULT 0"),
            ("lease_until", "timestamp with time zone", ""),
            ("updated_at", "timestamp with time zone", "NOT NULL"),
        ],
    ),
    (
        "steps",
        [
            ("usage", "json", ""),
            ("finished_at", "timestamp with time zone", ""),
            ("status", "varchar(16)", "NOT NULL"),
        ],
    ),
)


def _move_last(table: str, columns: list[tuple[str, str, str]]) -> None:
    """Add each column again at the end (nullable), fill it, drop the old one, rename it back."""
    for name, typ, constraints in columns:
        default = constraints.removeprefix("NOT NULL").strip()
        op.execute(f"ALTER TABLE {table} ADD COLUMN {name}__new {typ} {default}")
    fill = ", ".join(f"{name}__new = {name}::{typ}" for name, typ, _ in columns)
    op.execute(f"UPDATE {table} SET {fill}")
    for name, _, constraints in columns:
        op.execute(f"ALTER TABLE {table} DROP COLUMN {name}")
        op.execute(f"ALTER TABLE {table} RENAME COLUMN {name}__new TO {name}")
        if constraints.startswith("NOT NULL"):
            op.execute(f"ALTER TABLE {table} ALTER COLUMN {name} SET NOT NULL")


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table, columns in _MOVES:
        _move_last(table, columns)
    op.alter_column(
        "step_attempts", "usage", type_=sa.JSON(), existing_type=JSONB(), postgresql_using="usage::json"
    )


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    for table in ("steps", "step_attempts"):
        op.alter_column(
            table, "usage", type_=JSONB(), existing_type=sa.JSON(), postgresql_using="usage::jsonb"
        )

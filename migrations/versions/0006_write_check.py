"""dayzero_write_check(): a step's statement refuses itself when its fence or a keyed row misses

The runner's step transaction on PostgreSQL is one statement (`tasks.writer`). Run in a
transaction of its own (autocommit), the statement and its COMMIT are one round trip instead of
three (BEGIN + statement, COMMIT); for that the statement must abort itself when the lease fence
did not hold or a keyed UPDATE did not hit its row, instead of returning that for the client to
roll back. This function raises SQLSTATE DZ001 (fence) or DZ002 (a row not in its expected
state); `tasks.writer` maps them back to "fence did not hold" / "not all hit". SQLite: nothing to
do (its path sends plain statements inside `BEGIN IMMEDIATE`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(
            """
            CREATE OR REPLACE FUNCTION dayzero_write_check(fenced boolean, hits bigint, expected integer)
            RETURNS boolean LANGUAGE plpgsql AS $$
            BEGIN
                IF NOT fenced THEN
                    RAISE EXCEPTION 'dayzero: the task row did not match the fence'
                        USING ERRCODE = 'DZ001';
                END IF;
                IF hits <> expected THEN
                    RAISE EXCEPTION 'dayzero: % of % keyed rows were in their expected state', hits, expected
                        USING ERRCODE = 'DZ002';
                END IF;
                RETURN true;
            END $$
            """
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS dayzero_write_check(boolean, bigint, integer)")

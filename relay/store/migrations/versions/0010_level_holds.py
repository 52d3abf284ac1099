"""Level holds and level versions: a table of backends found below their level's hold bar (why,
since when, how it ended), and the backend level version reporting decided from, so a level change
makes the reports of open PRs pending again.

Revision ID: 0010
Revises: 0009
Create Date: level holds
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "level_holds",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("backend", sa.String(100), nullable=False),
        sa.Column("level", sa.String(4), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("above_since", sa.DateTime(), nullable=True),
        sa.Column("ended_at", sa.DateTime(), nullable=True),
        sa.Column("ended_by", sa.String(300), nullable=True),
    )
    op.create_index("ix_level_holds_backend_ended", "level_holds", ["backend", "ended_at"])
    op.add_column("backends", sa.Column("level_changed_at", sa.DateTime(), nullable=True))
    op.add_column("reported_states", sa.Column("level_changed_at", sa.DateTime(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("reported_states") as batch:
        batch.drop_column("level_changed_at")
    with op.batch_alter_table("backends") as batch:
        batch.drop_column("level_changed_at")
    op.drop_index("ix_level_holds_backend_ended", table_name="level_holds")
    op.drop_table("level_holds")

"""Provenance: the torch a run tested (the report's torch.git_version) and whether it is the dispatched commit.

Revision ID: 0004
Revises: 0003
Create Date: provenance of a run's torch
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("torch_git_version", sa.String(64), nullable=True))
        batch.add_column(sa.Column("provenance", sa.String(16), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("provenance")
        batch.drop_column("torch_git_version")

"""Reporting finds its work by query: each reported state records the run version and the PR label
version it was decided from, and runs are indexed by when they last changed.

Revision ID: 0008
Revises: 0007
Create Date: reporting through rows
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("reported_states", sa.Column("run_updated_at", sa.DateTime(), nullable=True))
    op.add_column("reported_states", sa.Column("labels_recorded_at", sa.DateTime(), nullable=True))
    op.create_index("ix_runs_updated_at", "runs", ["updated_at"])


def downgrade() -> None:
    op.drop_index("ix_runs_updated_at", table_name="runs")
    with op.batch_alter_table("reported_states") as batch:
        batch.drop_column("labels_recorded_at")
        batch.drop_column("run_updated_at")

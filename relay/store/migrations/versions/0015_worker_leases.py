"""Worker leases: one row per worker that runs in one relay process at a time across replicas (the
level watch, the proposals pass), naming its holder and when the lease ends.

Revision ID: 0015
Revises: 0014
Create Date: one proposer and one watcher across replicas
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_leases",
        sa.Column("worker", sa.String(100), primary_key=True),
        sa.Column("holder", sa.String(200), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("worker_leases")

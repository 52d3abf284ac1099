"""Operations: the health probe row, the quarantine of rows background passes could not handle, and
per-credential rate-limit gates shared by every relay process.

Revision ID: 0003
Revises: 0002
Create Date: faults and replicas
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "store_probes",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("written_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_store_probes"),
    )
    op.create_table(
        "quarantine",
        sa.Column("worker", sa.String(50), nullable=False),
        sa.Column("subject", sa.String(200), nullable=False),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("quarantined_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("worker", "subject", name="pk_quarantine"),
    )
    op.create_table(
        "credential_gates",
        sa.Column("credential", sa.String(200), nullable=False),
        sa.Column("resting_until", sa.DateTime(), nullable=True),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("tokens_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("credential", name="pk_credential_gates"),
    )


def downgrade() -> None:
    op.drop_table("credential_gates")
    op.drop_table("quarantine")
    op.drop_table("store_probes")

"""OIDC identities: the repository and owner ids pinned at a backend's first OIDC callback.

Revision ID: 0007
Revises: 0006
Create Date: hostile input
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "oidc_identities",
        sa.Column("backend", sa.String(100), nullable=False),
        sa.Column("repository_id", sa.BigInteger(), nullable=False),
        sa.Column("repository_owner_id", sa.BigInteger(), nullable=False),
        sa.Column("pinned_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("backend", name="pk_oidc_identities"),
    )


def downgrade() -> None:
    op.drop_table("oidc_identities")

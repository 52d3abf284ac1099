"""Deliveries remember the sha256 of their signed body (unique), so a replay under a fresh delivery id is a duplicate.

Revision ID: 0006
Revises: 0005
Create Date: hostile input
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("deliveries") as batch:
        batch.add_column(sa.Column("body_sha256", sa.String(64), nullable=True))
    op.create_index("ux_deliveries_body_sha256", "deliveries", ["body_sha256"], unique=True)


def downgrade() -> None:
    op.drop_index("ux_deliveries_body_sha256", table_name="deliveries")
    with op.batch_alter_table("deliveries") as batch:
        batch.drop_column("body_sha256")

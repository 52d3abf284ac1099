"""Initial schema: deliveries, dispatches (outbox), pull_requests (labels), backends.

Revision ID: 0001
Revises:
Create Date: the intake side of the relay
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "deliveries",
        sa.Column("delivery_id", sa.String(100), nullable=False),
        sa.Column("event", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=True),
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("received_at", sa.DateTime(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("summary", sa.JSON(), nullable=False),
        sa.Column("payload", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("delivery_id", name="pk_deliveries"),
    )
    op.create_index("ix_deliveries_received_at", "deliveries", ["received_at"])

    op.create_table(
        "dispatches",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("delivery_id", sa.String(100), nullable=False),
        sa.Column("backend", sa.String(100), nullable=False),
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("event_type", sa.String(100), nullable=False),
        sa.Column("client_payload", sa.JSON(), nullable=False),
        sa.Column("nonce", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("created_at", sa.DateTime(), nullable=False),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(), nullable=False),
        sa.Column("sent_at", sa.DateTime(), nullable=True),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("claimed_until", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_dispatches"),
        sa.ForeignKeyConstraint(
            ["delivery_id"], ["deliveries.delivery_id"], name="fk_dispatches_delivery_id_deliveries"
        ),
        sa.UniqueConstraint("delivery_id", "backend", name="uq_dispatches_delivery_backend"),
        sa.UniqueConstraint("nonce", name="uq_dispatches_nonce"),
    )
    op.create_index("ix_dispatches_due", "dispatches", ["state", "next_attempt_at"])

    op.create_table(
        "pull_requests",
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("head_sha", sa.String(64), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("source_updated_at", sa.String(32), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("repository", "number", name="pk_pull_requests"),
    )

    op.create_table(
        "backends",
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("repository", sa.String(200), nullable=False),
        sa.Column("level", sa.String(4), nullable=False),
        sa.Column("label", sa.String(100), nullable=False),
        sa.Column("active", sa.Boolean(), nullable=False),
        sa.Column("synced_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_backends"),
    )


def downgrade() -> None:
    op.drop_table("backends")
    op.drop_table("pull_requests")
    op.drop_index("ix_dispatches_due", table_name="dispatches")
    op.drop_table("dispatches")
    op.drop_index("ix_deliveries_received_at", table_name="deliveries")
    op.drop_table("deliveries")

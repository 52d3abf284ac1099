"""Dispatch lanes: an index on (backend, state), so a claim finds a backend's call in flight (a live
``sending`` row, whichever process holds it) without scanning the outbox.

Revision ID: 0005
Revises: 0004
Create Date: faults and replicas
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_dispatches_backend_state", "dispatches", ["backend", "state"])


def downgrade() -> None:
    op.drop_index("ix_dispatches_backend_state", table_name="dispatches")

"""Claim lanes: an index on dispatches (state, backend, id), so a claim finds the backends with queued
rows, each one's oldest row and the calls in flight by index lookups, whatever the outbox's depth; it
replaces 0005's (backend, state) index, which it covers.

Revision ID: 0013
Revises: 0012
Create Date: a drain rate that does not fall with the outbox's depth
"""

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_dispatches_state_backend", "dispatches", ["state", "backend", "id"])
    op.drop_index("ix_dispatches_backend_state", table_name="dispatches")


def downgrade() -> None:
    op.create_index("ix_dispatches_backend_state", "dispatches", ["backend", "state"])
    op.drop_index("ix_dispatches_state_backend", table_name="dispatches")

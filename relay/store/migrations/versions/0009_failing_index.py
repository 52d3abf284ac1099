"""Failing tests: an index on test results by (outcome, backend, test id, recorded at), so "failing now"
reads a page of failures in order from its cursor instead of every result of the window.

Revision ID: 0009
Revises: 0008
Create Date: bounded dashboard reads
"""

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_test_results_outcome_backend_test", "test_results", ["outcome", "backend", "test_id", "recorded_at"])


def downgrade() -> None:
    op.drop_index("ix_test_results_outcome_backend_test", table_name="test_results")

"""Read indexes found by the query-plan audit (tests/relay/test_query_plans.py): runs by dispatch
time (the overview's newest runs, the level review's window) and deliveries by event (the re-run
watcher's poll), which read those tables whole before.

Revision ID: 0014
Revises: 0013
Create Date: every dashboard and API read from an index
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_runs_dispatched_at", "runs", ["dispatched_at", "id"])
    op.create_index("ix_deliveries_event_received_at", "deliveries", ["event", "received_at"])


def downgrade() -> None:
    op.drop_index("ix_deliveries_event_received_at", table_name="deliveries")
    op.drop_index("ix_runs_dispatched_at", table_name="runs")

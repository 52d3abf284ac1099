"""Results side: runs, test_results, reported_states, expired_nonces, rerun_requests.

Revision ID: 0002
Revises: 0001
Create Date: the results side of the relay
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("dispatch_id", _ID, nullable=False),
        sa.Column("delivery_id", sa.String(100), nullable=False),
        sa.Column("backend", sa.String(100), nullable=False),
        sa.Column("upstream_repository", sa.String(200), nullable=False),
        sa.Column("event", sa.String(100), nullable=False),
        sa.Column("pr_number", sa.Integer(), nullable=True),
        sa.Column("title", sa.Text(), nullable=True),
        sa.Column("head_sha", sa.String(64), nullable=False),
        sa.Column("head_ref", sa.String(255), nullable=True),
        sa.Column("run_id", sa.BigInteger(), nullable=True),
        sa.Column("run_attempt", sa.Integer(), nullable=True),
        sa.Column("run_url", sa.Text(), nullable=True),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("conclusion", sa.String(32), nullable=True),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=True),
        sa.Column("finished_at", sa.DateTime(), nullable=True),
        sa.Column("updated_at", sa.DateTime(), nullable=False),
        sa.Column("summary", sa.JSON(), nullable=True),
        sa.Column("torch_version", sa.String(100), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_runs"),
        sa.ForeignKeyConstraint(["dispatch_id"], ["dispatches.id"], name="fk_runs_dispatch_id_dispatches"),
        sa.UniqueConstraint("dispatch_id", "run_id", "run_attempt", name="uq_runs_dispatch_run_attempt"),
    )
    op.create_index("ix_runs_backend_dispatched", "runs", ["backend", "dispatched_at"])
    op.create_index("ix_runs_pr", "runs", ["upstream_repository", "pr_number"])
    op.create_index("ix_runs_state", "runs", ["state"])
    op.create_index("ix_runs_head_sha", "runs", ["head_sha"])

    op.create_table(
        "test_results",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("run_pk", _ID, nullable=False),
        sa.Column("backend", sa.String(100), nullable=False),
        sa.Column("head_sha", sa.String(64), nullable=False),
        sa.Column("suite", sa.String(200), nullable=False),
        sa.Column("test_id", sa.String(500), nullable=False),
        sa.Column("nodeid", sa.Text(), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("duration", sa.Float(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("recorded_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_test_results"),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_test_results_run_pk_runs"),
    )
    op.create_index("ix_test_results_test_backend", "test_results", ["test_id", "backend"])
    op.create_index("ix_test_results_run", "test_results", ["run_pk"])

    op.create_table(
        "reported_states",
        sa.Column("run_pk", _ID, nullable=False),
        sa.Column("target", sa.String(32), nullable=False),
        sa.Column("state", sa.String(200), nullable=False),
        sa.Column("external_id", sa.BigInteger(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("reported_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("run_pk", "target", name="pk_reported_states"),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_reported_states_run_pk_runs"),
    )

    op.create_table(
        "expired_nonces",
        sa.Column("dispatch_id", _ID, autoincrement=False, nullable=False),
        sa.Column("expired_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("dispatch_id", name="pk_expired_nonces"),
        sa.ForeignKeyConstraint(["dispatch_id"], ["dispatches.id"], name="fk_expired_nonces_dispatch_id_dispatches"),
    )

    op.create_table(
        "rerun_requests",
        sa.Column("delivery_id", sa.String(100), nullable=False),
        sa.Column("outcome", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("backends", sa.JSON(), nullable=False),
        sa.Column("handled_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("delivery_id", name="pk_rerun_requests"),
        sa.ForeignKeyConstraint(
            ["delivery_id"], ["deliveries.delivery_id"], name="fk_rerun_requests_delivery_id_deliveries"
        ),
    )


def downgrade() -> None:
    op.drop_table("rerun_requests")
    op.drop_table("expired_nonces")
    op.drop_table("reported_states")
    op.drop_index("ix_test_results_run", table_name="test_results")
    op.drop_index("ix_test_results_test_backend", table_name="test_results")
    op.drop_table("test_results")
    for name in ("ix_runs_head_sha", "ix_runs_state", "ix_runs_pr", "ix_runs_backend_dispatched"):
        op.drop_index(name, table_name="runs")
    op.drop_table("runs")

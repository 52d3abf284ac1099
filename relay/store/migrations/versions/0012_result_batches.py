"""Result batches: a big report's test results are written in chunks of their own before the run's
final transition, which makes them visible by setting ``runs.results_batch`` (see
``relay.store.result_batches``); existing results and runs are batch 0, so they stay visible.

Revision ID: 0012
Revises: 0010
Create Date: results in their own transactions
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0010"
branch_labels = None
depends_on = None

_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "result_batches",
        sa.Column("id", _ID, autoincrement=True, nullable=False),
        sa.Column("run_pk", _ID, nullable=False),
        sa.Column("opened_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_result_batches"),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_result_batches_run_pk_runs"),
    )
    op.create_index("ix_result_batches_run_pk", "result_batches", ["run_pk"])
    op.add_column("test_results", sa.Column("batch", _ID, server_default="0", nullable=False))
    op.add_column("runs", sa.Column("results_batch", _ID, server_default="0", nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("results_batch")
    with op.batch_alter_table("test_results") as batch:
        batch.drop_column("batch")
    op.drop_index("ix_result_batches_run_pk", table_name="result_batches")
    op.drop_table("result_batches")

"""jobs.runner and jobs.runner_ref: jobs Kubernetes runs (a Kueue Workload), not the local
runner (issue 35, item 5)

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06 01:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Existing jobs are the local runner's (null runner)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("runner", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("runner_ref", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Earlier code knows only the local runner: a Kueue job's row would look like one that
    lost its runner (the next reconcile ends it)."""
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("runner_ref")
        batch_op.drop_column("runner")

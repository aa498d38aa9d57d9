"""utilization_samples: raw samples of the last window, so every replica decides reclaim alike

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 00:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Empty: the first rounds after the upgrade see the samples posted since (stale before)."""
    op.create_table(
        "utilization_samples",
        sa.Column("gpu_uuid", sa.String(length=64), nullable=False),
        sa.Column("start", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("ts", sa.Float(), nullable=False),
        sa.Column("util", sa.Float(), nullable=True),
        sa.Column("memory_used_mib", sa.Integer(), nullable=False),
        sa.Column("processes", sa.Integer(), nullable=True),
        sa.Column("lease_util", sa.JSON(), nullable=True),
        sa.PrimaryKeyConstraint("gpu_uuid", "start", "ts", name=op.f("pk_utilization_samples")),
    )
    with op.batch_alter_table("utilization_samples", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_utilization_samples_ts"), ["ts"], unique=False)


def downgrade() -> None:
    """Earlier code decides on the samples each replica holds in memory."""
    with op.batch_alter_table("utilization_samples", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_utilization_samples_ts"))
    op.drop_table("utilization_samples")

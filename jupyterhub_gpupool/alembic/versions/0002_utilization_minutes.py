"""one-minute utilization aggregates

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29 16:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "utilization_minutes",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=64), nullable=False),
        sa.Column("start", sa.Integer(), nullable=False),
        sa.Column("minute", sa.DateTime(), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("util_samples", sa.Integer(), nullable=False),
        sa.Column("util_mean", sa.Float(), nullable=True),
        sa.Column("util_max", sa.Float(), nullable=True),
        sa.Column("memory_used_mib_max", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_utilization_minutes")),
        sa.UniqueConstraint(
            "gpu_uuid", "start", "minute", name=op.f("uq_utilization_minutes_gpu_uuid")
        ),
    )
    with op.batch_alter_table("utilization_minutes", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_utilization_minutes_minute"), ["minute"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("utilization_minutes", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_utilization_minutes_minute"))
    op.drop_table("utilization_minutes")

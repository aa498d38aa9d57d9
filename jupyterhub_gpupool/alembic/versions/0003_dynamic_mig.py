"""dynamic MIG: what nodes report, and failed creations

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29 18:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.add_column(sa.Column("observed", sa.JSON(), nullable=True))
    with op.batch_alter_table("mig_instances", schema=None) as batch_op:
        batch_op.add_column(sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"))
        batch_op.add_column(sa.Column("error", sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("mig_instances", schema=None) as batch_op:
        batch_op.drop_column("error")
        batch_op.drop_column("attempts")
    with op.batch_alter_table("gpus", schema=None) as batch_op:
        batch_op.drop_column("observed")

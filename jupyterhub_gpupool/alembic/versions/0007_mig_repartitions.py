"""admins' MIG re-partitions of a GPU: the layout asked for, how the node applies it, where it is

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-08 10:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "mig_repartitions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("node", sa.String(length=255), nullable=False),
        sa.Column("gpu_uuid", sa.String(length=64), nullable=False),
        sa.Column("layout", sa.JSON(), nullable=False),
        sa.Column("method", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.Column("updated", sa.DateTime(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("was_cordoned", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_mig_repartitions")),
    )
    op.create_index(op.f("ix_mig_repartitions_node"), "mig_repartitions", ["node"])
    op.create_index(op.f("ix_mig_repartitions_gpu_uuid"), "mig_repartitions", ["gpu_uuid"])


def downgrade() -> None:
    op.drop_index(op.f("ix_mig_repartitions_gpu_uuid"), table_name="mig_repartitions")
    op.drop_index(op.f("ix_mig_repartitions_node"), table_name="mig_repartitions")
    op.drop_table("mig_repartitions")

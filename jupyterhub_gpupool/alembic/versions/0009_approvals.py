"""approvals: the awaiting_approval state (a longer state column), the ask and its decision on
the lease, the lapse of an approved duration, and the quotas' exception ceiling

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 16:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.alter_column(
            "state", existing_type=sa.String(16), type_=sa.String(24), existing_nullable=False
        )
        batch.add_column(sa.Column("approval", sa.JSON(), nullable=True))
        batch.add_column(
            sa.Column("exception", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("lapses", sa.DateTime(), nullable=True))
    with op.batch_alter_table("quotas") as batch:
        batch.add_column(sa.Column("exception", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("quotas") as batch:
        batch.drop_column("exception")
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("lapses")
        batch.drop_column("exception")
        batch.drop_column("approval")
        batch.alter_column(
            "state", existing_type=sa.String(24), type_=sa.String(16), existing_nullable=False
        )

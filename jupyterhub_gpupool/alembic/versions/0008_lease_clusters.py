"""the clusters a lease's hub launches into, so a queued request stays there across restarts

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-08 11:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("clusters", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("clusters")

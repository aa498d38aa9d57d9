"""leases.replicas: copies of the offer one lease holds, an inference job's replicas
(issue 35, item 1: counted against the group's quota)

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06 04:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Every existing lease holds one copy of its offer."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("replicas", sa.Integer(), nullable=False, server_default="1"))


def downgrade() -> None:
    """Earlier code reads a lease of several replicas as one copy of its offer holding more
    devices and units than the offer has: it keeps them until the lease ends."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("replicas")

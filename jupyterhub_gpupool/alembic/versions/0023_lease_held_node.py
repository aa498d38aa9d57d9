"""leases.held_node: the node held for a long-waiting request, kept until it is granted
or gone (issue 35, item 6: the headroom's sticky hold)

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06 14:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """No request holds a remembered node yet: the next preemption round says which."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("held_node", sa.String(length=255), nullable=True))


def downgrade() -> None:
    """Earlier code chooses the held node afresh at every decision."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("held_node")

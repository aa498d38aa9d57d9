"""quotas.budget_action and quotas.budget_minimum: what a spent budget does (refuse, notify or
stop) and the least budget a grant starts with

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 01:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Existing quotas keep what they did: a spent budget refuses new grants, no minimum."""
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("budget_action", sa.String(length=8), server_default="refuse", nullable=False)
        )
        batch_op.add_column(
            sa.Column("budget_minimum", sa.Float(), server_default="0", nullable=False)
        )


def downgrade() -> None:
    """Earlier code refuses at a spent budget and knows no minimum."""
    with op.batch_alter_table("quotas", schema=None) as batch_op:
        batch_op.drop_column("budget_minimum")
        batch_op.drop_column("budget_action")

"""pool_changes: the leases each batch of decisions wrote, by pool version, so another replica
catches up by reloading those leases instead of rebuilding its allocator

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 14:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pool_changes",
        sa.Column("version", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("leases", sa.JSON(), nullable=False),
    )


def downgrade() -> None:
    """Earlier code rebuilds after every other replica's commit and never reads the table."""
    op.drop_table("pool_changes")

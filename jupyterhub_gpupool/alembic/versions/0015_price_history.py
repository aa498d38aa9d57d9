"""prices: the price table over time (each price with its effective start), so a past hour is
priced at the price in force then and a changed config never reprices it

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 01:00:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Empty: the service records the pool config's prices at its next start (the whole
    schedule, as nothing is recorded yet, so past months read as before)."""
    op.create_table(
        "prices",
        sa.Column("model", sa.String(length=64), nullable=False),
        sa.Column("start", sa.DateTime(), nullable=False),
        sa.Column("held", sa.String(length=32), nullable=True),
        sa.Column("busy", sa.String(length=32), nullable=True),
        sa.Column("currency", sa.String(length=8), nullable=False),
        sa.PrimaryKeyConstraint("model", "start", name=op.f("pk_prices")),
    )


def downgrade() -> None:
    """Earlier code prices every hour at the pool config's current prices."""
    op.drop_table("prices")

"""an index for queue wait estimates: an offer's releases of the last hour

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 20:00:00
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_leases_offer_released", "leases", ["offer", "released"])


def downgrade() -> None:
    op.drop_index("ix_leases_offer_released", table_name="leases")

"""the hub a lease came from (null: the pool's own hub), so the pool reconciles only its own
hub's leases with that hub and a spawner sees only its hub's leases

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01 16:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.add_column(sa.Column("hub", sa.String(length=255), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        batch.drop_column("hub")

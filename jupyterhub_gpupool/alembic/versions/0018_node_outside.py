"""nodes.outside: the devices pods the pool did not place hold (Kubernetes), never granted

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 21:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0018"
# main has 0017_presence (written beside this branch): on merge this revises "0017"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Null: nothing known to be held outside until the cluster is read."""
    with op.batch_alter_table("nodes") as batch:
        batch.add_column(sa.Column("outside", sa.JSON(), nullable=True))


def downgrade() -> None:
    """Earlier code grants every device of its nodes."""
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("outside")

"""requests refused outright, counted per day, offer and code (capacity planning tells refusals
by quota from refusals by capacity; a refused request writes no lease row)

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01 16:10:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "refusals",
        sa.Column("day", sa.DateTime(), nullable=False),
        sa.Column("offer", sa.String(64), nullable=False),
        sa.Column("code", sa.String(32), nullable=False),
        sa.Column("count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("day", "offer", "code", name=op.f("pk_refusals")),
    )


def downgrade() -> None:
    op.drop_table("refusals")

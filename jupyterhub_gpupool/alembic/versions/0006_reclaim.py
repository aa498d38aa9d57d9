"""idle-GPU reclamation: each lease's counts and notice, the reclaimer's leader lock and the
admin's policy override

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 12:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("leases") as batch:
        # the reasons say what was seen and for how long: longer than 64 characters
        batch.alter_column(
            "reclaim_reason", existing_type=sa.String(length=64), type_=sa.Text(), nullable=True
        )
        batch.add_column(sa.Column("reclaim_state", sa.JSON(), nullable=True))
        batch.add_column(sa.Column("reclaim_kind", sa.String(length=16), nullable=True))
        batch.add_column(sa.Column("reclaim_action", sa.String(length=128), nullable=True))
        batch.add_column(sa.Column("reclaim_issued", sa.DateTime(), nullable=True))
        batch.add_column(
            sa.Column("reclaim_pressure", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        batch.add_column(sa.Column("reclaim_for", sa.String(length=64), nullable=True))
        batch.add_column(sa.Column("reclaim_acting", sa.DateTime(), nullable=True))
        batch.add_column(sa.Column("reclaim_release", sa.String(length=32), nullable=True))
        batch.add_column(sa.Column("reclaim_target", sa.String(length=64), nullable=True))
    op.create_table(
        "reclaim_leader",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("holder", sa.String(length=255), nullable=True),
        sa.Column("expires", sa.DateTime(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reclaim_leader")),
    )
    op.create_table(
        "reclaim_policies",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("actor", sa.String(length=255), nullable=False),
        sa.Column("updated", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_reclaim_policies")),
    )


def downgrade() -> None:
    op.drop_table("reclaim_policies")
    op.drop_table("reclaim_leader")
    with op.batch_alter_table("leases") as batch:
        for name in (
            "reclaim_target",
            "reclaim_release",
            "reclaim_acting",
            "reclaim_for",
            "reclaim_pressure",
            "reclaim_issued",
            "reclaim_action",
            "reclaim_kind",
            "reclaim_state",
        ):
            batch.drop_column(name)
        batch.alter_column(
            "reclaim_reason", existing_type=sa.Text(), type_=sa.String(length=64), nullable=True
        )

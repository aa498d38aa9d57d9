"""lease_usage: busy time per lease and UTC hour, recorded when it happens (chargeback from
facts placed in time; leases.busy_hours stays as the lease's running total)

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-05 00:30:00
"""

from datetime import datetime, timedelta

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "lease_usage",
        sa.Column("lease_id", sa.String(length=64), nullable=False),
        sa.Column("hour", sa.DateTime(), nullable=False),
        sa.Column("busy_seconds", sa.Float(), nullable=False),
        sa.Column("estimated_seconds", sa.Float(), nullable=False),
        sa.PrimaryKeyConstraint("lease_id", "hour", name=op.f("pk_lease_usage")),
    )
    with op.batch_alter_table("lease_usage", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_lease_usage_hour"), ["hour"], unique=False)
    _backfill()


def _backfill() -> None:
    """Leases recorded before: their busy hours (no time of their own) are spread evenly over
    the hours they were held, as the earlier reports did, so a past month reads as before."""
    bind = op.get_bind()
    leases = sa.table(
        "leases",
        sa.column("id", sa.String),
        sa.column("granted", sa.DateTime),
        sa.column("released", sa.DateTime),
        sa.column("busy_hours", sa.Float),
    )
    usage = sa.table(
        "lease_usage",
        sa.column("lease_id", sa.String),
        sa.column("hour", sa.DateTime),
        sa.column("busy_seconds", sa.Float),
        sa.column("estimated_seconds", sa.Float),
    )
    query = sa.select(leases).where(leases.c.granted.is_not(None), leases.c.busy_hours > 0)
    rows = []
    for lease in bind.execute(query):
        start = lease.granted
        end = lease.released or datetime.utcnow()
        span = (end - start).total_seconds()
        if span <= 0:
            continue
        share = min(1.0, lease.busy_hours * 3600.0 / span)
        h = start.replace(minute=0, second=0, microsecond=0)
        while h < end:
            held = (min(end, h + timedelta(hours=1)) - max(start, h)).total_seconds()
            rows.append(
                {"lease_id": lease.id, "hour": h, "busy_seconds": held * share,
                 "estimated_seconds": 0.0}
            )  # fmt: skip
            h += timedelta(hours=1)
    for i in range(0, len(rows), 500):
        bind.execute(usage.insert(), rows[i : i + 500])


def downgrade() -> None:
    """Earlier code reads only leases.busy_hours (spread over each lease's life)."""
    with op.batch_alter_table("lease_usage", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_lease_usage_hour"))
    op.drop_table("lease_usage")

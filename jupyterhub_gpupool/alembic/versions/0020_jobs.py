"""jobs, leases.holder and leases.workload: job leases not bound to a hub server (issue 35)

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 00:30:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0020"
# written beside 0019 (another branch): on merge this revises "0019"
down_revision = "0019"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Existing leases are servers' (no holder, class interactive); no job exists yet."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("holder", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("workload", sa.String(length=64), nullable=True))
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("user", sa.String(length=255), nullable=False),
        sa.Column("group", sa.String(length=255), nullable=True),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("offer", sa.String(length=64), nullable=False),
        sa.Column("workload", sa.String(length=64), nullable=False),
        sa.Column("command", sa.JSON(), nullable=False),
        sa.Column("env", sa.JSON(), nullable=True),
        sa.Column("cwd", sa.Text(), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=True),
        sa.Column("lease_id", sa.String(length=64), nullable=True),
        sa.Column("node", sa.String(length=255), nullable=True),
        sa.Column("devices", sa.JSON(), nullable=False),
        sa.Column("created", sa.DateTime(), nullable=False),
        sa.Column("started", sa.DateTime(), nullable=True),
        sa.Column("ended", sa.DateTime(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("pid", sa.Integer(), nullable=True),
        sa.Column("notice_deadline", sa.DateTime(), nullable=True),
        sa.Column("runner_seen", sa.DateTime(), nullable=True),
        sa.Column("log", sa.Text(), nullable=False),
        sa.Column("log_start", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(batch_op.f("ix_jobs_user"), ["user"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_state"), ["state"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_lease_id"), ["lease_id"], unique=False)
        batch_op.create_index(batch_op.f("ix_jobs_node"), ["node"], unique=False)


def downgrade() -> None:
    """Earlier code knows no jobs: their rows go (their leases stay, as leases of nobody's
    server, which the next reconcile releases)."""
    op.drop_table("jobs")
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("workload")
        batch_op.drop_column("holder")

"""leases.server_url, leases.presence_source and leases.last_input: where the reclaimer reads
a server without going through the proxy, and the input the user's lab reports

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 21:40:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Existing leases have no address (the reclaimer goes through the proxy for them, as
    before) and no lab reports (their presence is what the reclaimer sees)."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.add_column(sa.Column("server_url", sa.String(length=2048), nullable=True))
        batch_op.add_column(sa.Column("presence_source", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("last_input", sa.DateTime(), nullable=True))


def downgrade() -> None:
    """Earlier code reads every server through the proxy and knows no lab reports."""
    with op.batch_alter_table("leases", schema=None) as batch_op:
        batch_op.drop_column("last_input")
        batch_op.drop_column("presence_source")
        batch_op.drop_column("server_url")

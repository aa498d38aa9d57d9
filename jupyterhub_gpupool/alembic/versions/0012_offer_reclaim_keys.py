"""drop the offer keys idle_timeout and reclaim_policy from stored offer specs: they were
accepted and never read (reclaim settings live in the pool config's reclaim: section), and the
offer parser now refuses them

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01 19:20:00
"""

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_KEYS = ("idle_timeout", "reclaim_policy")
_offers = sa.table("offers", sa.column("name", sa.String), sa.column("spec", sa.JSON))


def upgrade() -> None:
    bind = op.get_bind()
    for name, spec in bind.execute(sa.select(_offers.c.name, _offers.c.spec)).all():
        if isinstance(spec, dict) and any(k in spec for k in _KEYS):
            kept = {k: v for k, v in spec.items() if k not in _KEYS}
            bind.execute(_offers.update().where(_offers.c.name == name).values(spec=kept))


def downgrade() -> None:
    """Nothing to restore: the earlier code reads a missing key as its default."""

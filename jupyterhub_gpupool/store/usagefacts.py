"""Reads of the busy time recorded per lease and hour (``lease_usage``; written by
``AdminStore.add_busy``), shared by the chargeback, the capacity page and the user page."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select

from .. import orm
from ..pool.usage import BusyTime, LeaseSpan, hour_of
from .views import ViewStore


def span_of(row: Any) -> LeaseSpan:
    """What a line item needs of a lease row (or a planning record)."""
    assert row.granted is not None
    return LeaseSpan(row.id, getattr(row, "model", None), row.units_f, row.granted, row.released)


class BusyTimeStore(ViewStore):
    """The busy time of leases per hour."""

    def busy_time(
        self, leases: Iterable[str], start: datetime, end: datetime
    ) -> dict[str, dict[datetime, BusyTime]]:
        """The recorded busy time of ``leases`` per hour, for the hours [start, end) touches."""
        ids = sorted(set(leases))
        out: dict[str, dict[datetime, BusyTime]] = {}
        U = orm.LeaseUsageRow
        with self.read() as db:
            for i in range(0, len(ids), 500):
                query = select(U).where(
                    U.lease_id.in_(ids[i : i + 500]), U.hour >= hour_of(start), U.hour < end
                )
                for r in db.scalars(query):
                    out.setdefault(r.lease_id, {})[r.hour] = (r.busy_seconds, r.estimated_seconds)
        return out

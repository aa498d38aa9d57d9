"""A lease's presence as its server's lab reports it: the answer of ``POST
allocations/{id}/presence`` (``ReportPresence``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ... import orm

__all__ = ["PresenceView", "presence_view"]


@dataclass(frozen=True)
class PresenceView:
    """``source``: ``lab`` once the lab reported (None: no lab reports, the reclaimer's
    observations are presence); ``last_input``: the user's last input the lab reported (None:
    none yet)."""

    lease: str
    source: str | None
    last_input: datetime | None


def presence_view(row: orm.LeaseRow) -> PresenceView:
    """The presence of the lease of ``row``."""
    return PresenceView(row.id, row.presence_source, row.last_input)

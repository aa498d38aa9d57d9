"""A lease's presence as its server's lab reports it: the answer of ``POST
allocations/{id}/presence`` (``ReportPresence``)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from ... import orm

__all__ = ["PresenceView", "ServerUrlView", "presence_view", "server_url_view"]


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


@dataclass(frozen=True)
class ServerUrlView:
    """Where the lease's server listens, as the spawner said (``PUT allocations/{id}/server``;
    None: not said, the reclaimer reads it through the proxy)."""

    lease: str
    server_url: str | None


def server_url_view(row: orm.LeaseRow) -> ServerUrlView:
    """The server address of the lease of ``row``."""
    return ServerUrlView(row.id, row.server_url)

"""The audit log's read model: ``EventView``, one audit event as the log stored it.

An event's ``data`` is the payload its writer stored (plain JSON values, written once and never
changed), so the view carries it as it is; the serializer (``service/serialize/events.py``)
writes the time's text.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ... import orm


@dataclass(frozen=True)
class EventView:
    """An audit event: its ``id`` (the log's order), when (naive UTC), who, what ``kind``,
    the lease and user it concerns (None: neither) and its stored ``data``."""

    id: int
    ts: datetime
    actor: str
    kind: str
    lease: str | None
    user: str | None
    data: dict[str, Any]


def event_view(row: orm.EventRow) -> EventView:
    """The view of an event row."""
    return EventView(row.id, row.ts, row.actor, row.kind, row.lease_id, row.user, row.data)

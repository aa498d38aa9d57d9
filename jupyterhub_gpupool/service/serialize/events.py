"""An audit event's JSON (``GET events``)."""

from __future__ import annotations

from typing import Any

from ...store.read.events import EventView
from ...timeparse import format_time

__all__ = ["event_json"]


def event_json(view: EventView) -> dict[str, Any]:
    """``id``, ``ts``, ``actor``, ``kind``, ``lease``, ``user`` and ``data``."""
    return {
        "id": view.id,
        "ts": format_time(view.ts),
        "actor": view.actor,
        "kind": view.kind,
        "lease": view.lease,
        "user": view.user,
        "data": view.data,
    }

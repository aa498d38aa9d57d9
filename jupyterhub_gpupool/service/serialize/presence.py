"""A lease's presence JSON (``POST allocations/{id}/presence``)."""

from __future__ import annotations

from typing import Any

from ...store.read.presence import PresenceView
from ...timeparse import format_time

__all__ = ["presence_json"]


def presence_json(view: PresenceView) -> dict[str, Any]:
    """``lease``, ``source`` (None: no lab reports) and ``last_input`` (None: none yet)."""
    return {
        "lease": view.lease,
        "source": view.source,
        "last_input": format_time(view.last_input),
    }

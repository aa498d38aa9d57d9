"""A lease's presence JSON (``POST allocations/{id}/presence``) and its server's address
(``PUT allocations/{id}/server``)."""

from __future__ import annotations

from typing import Any

from ...store.read.presence import PresenceView, ServerUrlView
from ...timeparse import format_time

__all__ = ["presence_json", "server_url_json"]


def presence_json(view: PresenceView) -> dict[str, Any]:
    """``lease``, ``source`` (None: no lab reports) and ``last_input`` (None: none yet)."""
    return {
        "lease": view.lease,
        "source": view.source,
        "last_input": format_time(view.last_input),
    }


def server_url_json(view: ServerUrlView) -> dict[str, Any]:
    """``lease`` and ``server_url``."""
    return {"lease": view.lease, "server_url": view.server_url}

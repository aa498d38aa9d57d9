"""The headroom's JSON (``GET pool/map``'s ``headroom``)."""

from __future__ import annotations

from typing import Any

from ...store.read.headroom import HeadroomView
from ...timeparse import format_time

__all__ = ["headroom_json"]


def headroom_json(view: HeadroomView) -> dict[str, Any]:
    """``keep_free`` (as the config reads), ``models`` (``model``, ``keep_free``,
    ``free_units``, ``short_units``) and ``held`` (``node``, ``request``, ``user``, ``offer``,
    ``waiting_since``, ``out_of_count``)."""
    return {
        "keep_free": view.keep_free,
        "models": [
            {
                "model": m.model,
                "keep_free": m.keep_free,
                "free_units": m.free_units,
                "short_units": m.short_units,
            }
            for m in view.models
        ],
        "held": [
            {
                "node": x.node,
                "request": x.request,
                "user": x.user,
                "offer": x.offer,
                "waiting_since": format_time(x.waiting_since),
                "out_of_count": x.out_of_count,
            }
            for x in view.held
        ],
    }

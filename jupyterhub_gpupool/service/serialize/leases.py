"""A lease's JSON (``LeaseView``): the API's ``Lease`` schema, its reclaim notice (also in the
reclaimer's lease list) and the pages' lists."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...store.read.leases import LeaseView, ReclaimView, SlotView, WatchedLeaseView
from ...timeparse import format_time


def slot_json(slot: SlotView) -> dict[str, Any]:
    return {
        "gpu": slot.gpu,
        "kind": slot.kind,
        "profile": slot.profile,
        "start": slot.start,
        "milli": slot.milli,
        "mig_uuid": slot.mig_uuid,
    }


def reclaim_json(notice: ReclaimView) -> dict[str, Any]:
    """A notice: what it says (``heading``, ``keep``, ``why_not_kept``) and its terms."""
    return {
        "heading": notice.heading,
        "keep": notice.keep,
        "why_not_kept": notice.why_not_kept,
        "kind": notice.kind,
        "deadline": format_time(notice.deadline),
        "reason": notice.reason,
        "action": notice.action,
        "issued": format_time(notice.issued),
        "pressure": notice.pressure,
        "extensions": notice.extensions,
        "max_extensions": notice.max_extensions,
        "extendable": notice.extendable,
        "acting": notice.acting,
    }


def lease_json(view: LeaseView) -> dict[str, Any]:
    """The lease as the API answers it; ``fallback`` only where the grant has alternatives."""
    out: dict[str, Any] = {
        "id": view.id,
        "user": view.user,
        "server": view.server,
        "offer": view.offer,
        "group": view.group,
        "state": view.state,
        "reason": view.reason,
        "message": view.message,
        "units": view.units,
        "borrowed": view.borrowed,
        "node": view.node,
        "model": view.model,
        "created": format_time(view.created),
        "granted": format_time(view.granted),
        "activated": format_time(view.activated),
        "released": format_time(view.released),
        "release_reason": view.release_reason,
        "expires": format_time(view.expires),
        "resize_of": view.resize_of,
        "hub": view.hub,
        "position": view.position,
        "eta_seconds": view.eta_seconds,
        "reclaim": None if view.reclaim is None else reclaim_json(view.reclaim),
        "approval": None if view.approval is None else dict(view.approval),
        "exception": view.exception,
        "lapses": format_time(view.lapses),
        "slots": [slot_json(s) for s in view.slots],
        "ready": view.ready,
        "cluster": view.cluster,
    }
    if view.fallback:
        out["fallback"] = [
            {"gpu": s.gpu, "kind": s.kind, "profile": s.profile, "start": s.start}
            for s in view.fallback
        ]
    return out


def leases_json(views: Iterable[LeaseView]) -> list[dict[str, Any]]:
    """A list of leases (a page's items)."""
    return [lease_json(v) for v in views]


def watched_lease_json(view: WatchedLeaseView) -> dict[str, Any]:
    """A lease in the reclaimer's list (``GET reclaim/leases``)."""
    return {
        "id": view.id,
        "user": view.user,
        "server": view.server,
        "offer": view.offer,
        "state": view.state,
        "node": view.node,
        "granted_at": format_time(view.granted),
        "server_url": view.server_url,
        "reclaim": None if view.reclaim is None else reclaim_json(view.reclaim),
    }

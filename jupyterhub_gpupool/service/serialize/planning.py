"""Capacity planning's JSON (``CapacityDayView``: the items of ``GET capacity`` and the admin
panel's capacity page): the day as ``YYYY-MM-DD`` (UTC), waits in minutes."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...store.read.planning import CapacityDayView


def capacity_day_json(view: CapacityDayView) -> dict[str, Any]:
    """One offer's day."""
    return {
        "offer": view.offer,
        "day": view.day.date().isoformat(),
        "requests": view.requests,
        "demand_unit_hours": view.demand_unit_hours,
        "held_unit_hours": view.held_unit_hours,
        "busy_unit_hours": view.busy_unit_hours,
        "waiting_unit_hours": view.waiting_unit_hours,
        "idle_share": view.idle_share,
        "wait_p50_min": view.waits.p50_min,
        "wait_p95_min": view.waits.p95_min,
        "queued_for_quota": view.queued_for_quota,
        "queued_for_capacity": view.queued_for_capacity,
        "refused_by_quota": view.refused_by_quota,
        "refused_by_capacity": view.refused_by_capacity,
    }


def capacity_json(views: Iterable[CapacityDayView]) -> list[dict[str, Any]]:
    """The days, by offer then day."""
    return [capacity_day_json(v) for v in views]

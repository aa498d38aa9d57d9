"""Recorded demand as capacity planning shows it: ``CapacityDayView`` (one offer's UTC day:
requests, demand, held, busy and waiting unit-hours, the queue waits, and the requests held
back by quota or by capacity), built by ``capacity_day_view`` from a day's ``DayCell`` (the
sums ``PlanningStore.capacity`` gathers from the recorded requests) and its refusals.

The figures are floats rounded as the report shows them (unit-hours to six decimals, shares to
four, waits to 0.1 min); the day is the naive UTC midnight that starts it. A view is frozen and
pickles (it crosses the writer process's pipe).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime


def nearest_rank(values: Sequence[float], q: float) -> float | None:
    """The ``q``-quantile by nearest rank: the smallest value at least ``q`` of them are at or
    below (a wait someone really had; None for no values)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class WaitFigures:
    """The p50 and p95 queue waits in minutes (nearest rank, to 0.1 min; None: no waits)."""

    p50_min: float | None
    p95_min: float | None


def wait_figures(waits: Iterable[float]) -> WaitFigures:
    """p50 and p95 of ``waits`` (seconds), in minutes."""
    w = list(waits)
    p50, p95 = nearest_rank(w, 0.5), nearest_rank(w, 0.95)
    return WaitFigures(
        None if p50 is None else round(p50 / 60, 1), None if p95 is None else round(p95 / 60, 1)
    )


@dataclass
class DayCell:
    """What one offer's day gathers while the requests are read (not a view: it is added to):
    requests asked that day, unit-hours held, busy and waited, each request's wait (seconds),
    and how many waited for quota and for capacity."""

    requests: int = 0
    held: float = 0.0
    busy: float = 0.0
    waiting: float = 0.0
    waits: list[float] = field(default_factory=list)
    quota: int = 0
    capacity: int = 0


@dataclass(frozen=True)
class CapacityDayView:
    """One offer's UTC day: requests asked, demand (unit-hours held plus waited), held, busy
    and waiting unit-hours, the idle share of the held ones, the queue waits of the day's
    requests, how many waited for quota and for capacity, and how many were refused outright
    by quota and by capacity."""

    offer: str
    day: datetime
    requests: int
    demand_unit_hours: float
    held_unit_hours: float
    busy_unit_hours: float
    waiting_unit_hours: float
    idle_share: float
    waits: WaitFigures
    queued_for_quota: int
    queued_for_capacity: int
    refused_by_quota: int
    refused_by_capacity: int


def capacity_day_view(
    offer: str, day: datetime, cell: DayCell, refused: tuple[int, int]
) -> CapacityDayView:
    """The day ``cell`` gathered; ``refused``: (by quota, by capacity) that day."""
    held = cell.held
    return CapacityDayView(
        offer=offer,
        day=day,
        requests=cell.requests,
        demand_unit_hours=round(held + cell.waiting, 6),
        held_unit_hours=round(held, 6),
        busy_unit_hours=round(cell.busy, 6),
        waiting_unit_hours=round(cell.waiting, 6),
        idle_share=round((held - cell.busy) / held, 4) if held else 0.0,
        waits=wait_figures(cell.waits),
        queued_for_quota=cell.quota,
        queued_for_capacity=cell.capacity,
        refused_by_quota=refused[0],
        refused_by_capacity=refused[1],
    )

"""What the admin panel and the user page read beyond a lease's own view, built by plain
functions from rows: the live leases with their age and idle time (``LiveLeaseView``), the
units held and queued over time (``UnitSeriesView``), a user's GPU-hours per day
(``DayUseView``), the quota table (``QuotaUseView``) and the effect of a quota change
(``QuotaEffectView``, the quota preview's answer). Frozen; they pickle."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from typing import Any

from ... import orm
from ...pool.quota import QuotaSpec
from ...pool.usage import LeaseSpan, line_item, unpriced
from ...pool.workloads import INTERACTIVE
from ..rows import epoch, held_hours
from .poolmap import PreemptingView
from .quotas import QuotaView

__all__ = [
    "DayUseView",
    "LiveLeaseView",
    "LiveNoticeView",
    "QuotaEffectView",
    "QuotaUseView",
    "UnitSeriesView",
    "day_uses",
    "live_lease_view",
    "unit_series_view",
]


@dataclass(frozen=True)
class LiveNoticeView:
    """A live lease's reclaim notice as the lease table shows it."""

    kind: str
    deadline: datetime | None
    reason: str | None
    acting: bool


@dataclass(frozen=True)
class LiveLeaseView:
    """A live lease as the admin's lease table shows it: whose, what holds it (``workload``,
    its job's name; None: a server's), since when (activated, else granted), in seconds
    at the time of reading, how long it has been held (``age_s``) and its GPU idle
    (``idle_s``; 0: not idle), its reclaim notice and its job's preemption notice."""

    id: str
    user: str
    server: str
    offer: str
    state: str
    units: float
    borrowed: bool
    node: str | None
    workload: str
    job: str | None
    since: datetime | None
    age_s: float
    idle_s: float
    notice: LiveNoticeView | None
    preempting: PreemptingView | None = None


def live_lease_view(
    row: Any, now: float, preempting: PreemptingView | None = None
) -> LiveLeaseView:
    """A live lease's view from its columns as ``PanelViews.live_leases`` reads them (a
    ``LeaseRow``'s names, and ``job``); ``now``: epoch seconds; ``preempting``: its job's
    preemption notice (None: its job, if any, is not ``preempting``)."""
    counts = row.reclaim_state or {}
    idle_since = counts.get("gpu_idle_since") or counts.get("idle_since")
    since = row.activated or row.granted
    return LiveLeaseView(
        id=row.id,
        user=row.user,
        server=row.server,
        offer=row.offer,
        state=row.state,
        units=row.units_f,
        borrowed=row.borrowed,
        node=row.node,
        workload=row.workload or INTERACTIVE,
        job=row.job,
        since=since,
        age_s=round(now - epoch(since), 1) if since else 0.0,
        idle_s=round(now - idle_since, 1) if idle_since else 0.0,
        notice=None
        if row.reclaim_kind is None
        else LiveNoticeView(
            row.reclaim_kind,
            row.reclaim_deadline,
            row.reclaim_reason,
            row.reclaim_acting is not None,
        ),
        preempting=preempting,
    )


@dataclass(frozen=True)
class UnitSeriesView:
    """GPU units held (``used``) and waited for (``queued``) at each sample time."""

    used: tuple[float, ...]
    queued: tuple[float, ...]


def unit_series_view(
    rows: Iterable[Sequence[Any]], start: datetime, end: datetime, step: float
) -> UnitSeriesView:
    """Units held and waited for at each ``step`` from ``start`` to ``end``, from the leases'
    (units, created, queued since, granted, released)."""
    t0, t1 = epoch(start), epoch(end)
    n = int((t1 - t0) // step) + 1
    used, queued = [0.0] * n, [0.0] * n

    def add(series: list[float], a: float, b: float, units: float) -> None:
        first = max(0, int(-(-(a - t0) // step)))  # the first sample time at or after a
        for i in range(first, n):
            if t0 + i * step >= b:
                break
            series[i] += units

    for units, created, queued_since, granted, released in rows:
        gone = epoch(released) if released else t1 + step
        if granted is not None:
            add(used, epoch(granted), gone, units)
        wait_from = queued_since or created  # created is NOT NULL
        if granted is None or granted > wait_from:
            add(queued, epoch(wait_from), epoch(granted) if granted else gone, units)
    return UnitSeriesView(tuple(round(u, 4) for u in used), tuple(round(q, 4) for q in queued))


@dataclass(frozen=True)
class DayUseView:
    """A user's GPU unit-hours on one (UTC) day: held, and busy."""

    day: date
    held: float
    busy: float


def day_uses(
    leases: Iterable[tuple[orm.LeaseRow, LeaseSpan]],
    busy: Mapping[str, Any],
    first: datetime,
    now: datetime,
    days: int,
) -> tuple[DayUseView, ...]:
    """Unit-hours per day of ``days`` days from ``first`` (a midnight) to ``now``, of the
    granted ``leases`` (each row with its span, ``usagefacts.span_of``; ``busy``: each lease's
    busy time, ``usagefacts.BusyTimeStore``):
    held, and the share of a lease's busy hours that falls in the day."""
    held_by = [0.0] * days
    busy_by = [0.0] * days
    for row, span in leases:
        for i in range(days):
            start = first + timedelta(days=i)
            stop = min(start + timedelta(days=1), now)
            if held_hours(row, start, stop):
                item = line_item(span, busy.get(row.id, {}), start, stop, now, unpriced)
                held_by[i] += float(item.held)
                busy_by[i] += float(item.busy)
    return tuple(
        DayUseView((first + timedelta(days=i)).date(), round(held_by[i], 3), round(busy_by[i], 3))
        for i in range(days)
    )


@dataclass(frozen=True)
class QuotaUseView:
    """A row of the quota table: the quota in effect and where it comes from, with the units
    held and borrowed now."""

    quota: QuotaView
    held: float
    borrowed_units: float


@dataclass(frozen=True)
class QuotaEffectView:
    """What a quota change would do now (``POST quotas/{kind}/{name}/preview``): the quota it
    would set, the units held, the live leases that would become borrowed or within
    guarantee, and how far over the new limit the holder would be."""

    kind: str
    name: str
    quota: QuotaSpec
    held: float
    become_borrowed: tuple[str, ...]
    become_within: tuple[str, ...]
    over_limit_by: float

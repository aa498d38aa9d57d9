"""Usage placed in time: busy time per lease and hour, the closed periods, and a lease's line item.

The facts (see the chargeback docs for the definitions):

* **Held** time is the lease's own interval, from its grant to its release (or now): a unit-hour
  is one GPU unit held for an hour, whether the server ever started (an unbound grant is held).
* **Busy** time is recorded as it happens, per lease and per UTC hour, from the samples of the
  lease's devices: each sample interval (at most a minute) whose sample shows activity by the
  evidence the reclaim rules use (:func:`busy_evidence`) adds its seconds to the hour(s) it falls
  in, divided by the lease's number of devices, so each GPU of a multi-GPU lease counts once
  (two GPUs busy for an hour make the lease busy for an hour, i.e. two unit-hours of a
  two-unit lease). Busy time judged from memory and processes (MIG without utilization) is
  also counted as *estimated*.
* A **closed** period: once :data:`CLOSE_GRACE` has passed after the end of a calendar month,
  no fact of that month is recorded any more (a late sample is dropped), so a finished month
  reads identically forever.
* **Line items**: a lease's usage within a range is one line item; its unit-hours are taken to
  six decimals and its cost (each hour at the price in force then) is rounded once, to the cent,
  half up. A report row is the sum of its line items and a total the sum of its rows, so every
  grouping of the same range has the same total.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

from .idlesignal import GpuSample, gpu_activity
from .pricing import ModelPrice, cents, to_hours

HOUR = timedelta(hours=1)
#: After a calendar month ends, facts of it are still taken this long (an agent's backlog).
CLOSE_GRACE = timedelta(hours=1)
#: A sample interval longer than this counts only this much (a gap in telemetry is not busy).
MAX_INTERVAL = 60.0

#: (busy seconds, of which estimated seconds) of one lease in one hour.
BusyTime = tuple[float, float]
#: (lease id, naive UTC hour) → its busy time.
UsageFacts = dict[tuple[str, datetime], BusyTime]


def hour_of(t: datetime) -> datetime:
    """The hour ``t`` falls in (naive UTC)."""
    return t.replace(minute=0, second=0, microsecond=0)


def next_month(t: datetime) -> datetime:
    """The first instant of the calendar month after ``t``'s."""
    return datetime(t.year + (t.month == 12), t.month % 12 + 1, 1)


def period_closed(hour: datetime, now: datetime) -> bool:
    """Whether the month of ``hour`` is closed at ``now`` (its facts can no longer change)."""
    return now >= next_month(hour) + CLOSE_GRACE


def busy_evidence(sample: GpuSample, threshold: float) -> str | None:
    """``measured`` when the sample's utilization (or GPM activity) is at or above
    ``threshold`` percent; where there is none (MIG before Hopper), ``estimated`` when the
    reclaim rules would not call the device idle (a process or memory held: see
    :func:`.idlesignal.gpu_activity`); else ``None`` (not busy)."""
    if sample.util is not None:
        return "measured" if sample.util >= threshold else None
    return None if gpu_activity([sample], threshold) == "idle" else "estimated"


def add_interval(
    facts: UsageFacts, lease: str, end: datetime, seconds: float, share: float, estimated: bool
) -> None:
    """Add the busy interval of ``seconds`` ending at ``end`` to ``lease``'s hours, times
    ``share`` (1 / the lease's devices), split at hour boundaries."""
    t1 = end
    t0 = end - timedelta(seconds=seconds)
    while t1 > t0:
        h = hour_of(t1 - timedelta(microseconds=1))
        part = (t1 - max(t0, h)).total_seconds() * share
        busy, est = facts.get((lease, h), (0.0, 0.0))
        facts[(lease, h)] = (busy + part, est + (part if estimated else 0.0))
        t1 = max(t0, h)


def busy_from(lease: str, start: datetime, hours: float, estimated: bool = False) -> UsageFacts:
    """``hours`` of busy time from ``start`` on, in one piece (a convenience for callers that
    know a busy stretch rather than samples)."""
    facts: UsageFacts = {}
    end = start + timedelta(hours=hours)
    add_interval(facts, lease, end, hours * 3600.0, 1.0, estimated)
    return facts


@dataclass(frozen=True)
class LeaseSpan:
    """What a line item needs of one lease."""

    id: str
    model: str | None
    units: float
    granted: datetime
    released: datetime | None


@dataclass(frozen=True)
class LineItem:
    """A lease's usage within a range: unit-hours to six decimals, the cost rounded once."""

    held: Decimal
    busy: Decimal
    estimated: Decimal
    unpriced: Decimal
    cost: Decimal
    #: what its idle unit-hours cost at the held price (rounded once, as the cost)
    idle_cost: Decimal = Decimal(0)
    #: each price used: (model, first hour, held price, busy price)
    prices: tuple[tuple[str, datetime, ModelPrice], ...] = ()


def unpriced(model: str | None, hour: datetime) -> None:
    """A ``price_at`` for figures without costs."""
    return None


def _overlap(a0: datetime, a1: datetime, b0: datetime, b1: datetime) -> float:
    return max(0.0, (min(a1, b1) - max(a0, b0)).total_seconds())


def line_item(
    lease: LeaseSpan,
    busy: Mapping[datetime, BusyTime],
    start: datetime,
    end: datetime,
    now: datetime,
    price_at: Callable[[str | None, datetime], tuple[datetime, ModelPrice] | None],
) -> LineItem:
    """The line item of ``lease`` within [start, end) as of ``now``.

    ``busy`` holds the lease's recorded busy time per hour; ``price_at(model, hour)`` gives the
    price in force at that hour (with the hour it took effect) or None (unpriced). Held time is
    the lease's interval within the range; the busy time of an hour is at most the time the
    lease was held in that hour; an hour the range cuts counts the share of its busy time that
    the range holds of the lease's time in it.
    """
    stop = min(end, now)
    gone = min(lease.released or now, now)
    lo, hi = max(lease.granted, start), min(gone, stop)
    groups: dict[tuple[datetime, ModelPrice] | None, list[float]] = {}
    h = hour_of(lo)
    while h < hi:
        nh = h + HOUR
        in_range = _overlap(lease.granted, gone, max(h, start), min(nh, stop))
        if in_range > 0:
            in_hour = _overlap(lease.granted, gone, h, nh)
            b, e = busy.get(h, (0.0, 0.0))
            b = min(b, in_hour)
            e = min(e, b)
            f = in_range / in_hour
            acc = groups.setdefault(price_at(lease.model, h), [0.0, 0.0, 0.0])
            acc[0] += in_range
            acc[1] += b * f
            acc[2] += e * f
        h = nh
    held = busy_t = est = unpriced = Decimal(0)
    exact = idle = Decimal(0)
    used = []
    for price, (hs, bs, es) in sorted(groups.items(), key=lambda kv: kv[0][0] if kv[0] else lo):
        gh = to_hours(hs / 3600.0 * lease.units)
        gb = min(gh, to_hours(bs / 3600.0 * lease.units))
        ge = min(gb, to_hours(es / 3600.0 * lease.units))
        held, busy_t, est = held + gh, busy_t + gb, est + ge
        if price is None:
            unpriced += gh
        else:
            exact += (gh - gb) * price[1].held + gb * price[1].busy
            idle += (gh - gb) * price[1].held
            used.append((lease.model or "", price[0], price[1]))
    return LineItem(held, busy_t, est, unpriced, cents(exact), cents(idle), tuple(used))

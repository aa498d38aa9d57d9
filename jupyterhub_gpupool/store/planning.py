"""Capacity planning from the recorded leases: per offer and per day, the demand in unit-hours,
the queue waits, the requests held back by quota or by capacity, and the share of held time that
was idle. The what-if replay (``simulate/whatif.py``) reads the same records.

A lease row is a request: created (asked), maybe granted, released (stopped, withdrawn,
reclaimed...); one that awaited an administrator counts from its approval (``queued_at``). Its
``queued`` audit event says why it waited (``quota``, ``no_capacity`` or ``fairness``). A
request refused outright writes no lease row; refusals by quota and by capacity are counted per
day and offer (``record_refusal``, ``orm.RefusalRow``) instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from fractions import Fraction

from sqlalchemy import or_, select

from .. import orm
from ..timeparse import parse_time
from .chargeback import ChargebackStore, lease_figures
from .errors import StoreError
from .read.planning import (
    CapacityDayView,
    DayCell,
    capacity_day_view,
)
from .rows import from_epoch, upsert_insert

DAY = timedelta(days=1)
#: Refusals capacity planning counts: the quota's (more quota would have served them) and the
#: hardware's (more or other hardware would have). Malformed asks are neither.
QUOTA_REFUSALS = ("no_quota", "exceeds_limit", "budget_exhausted", "exceeds_exception_ceiling")
CAPACITY_REFUSALS = ("no_such_hardware", "exceeds_node_size", "cluster_not_served")


@dataclass(frozen=True)
class Record:
    """One recorded request, as the replay and the daily figures need it (naive UTC)."""

    id: str
    user: str
    server: str
    offer: str
    group: str | None
    groups: tuple[str, ...]
    clusters: tuple[str, ...]
    priority: int
    created: datetime  # when it joined the queue (approved: when an administrator approved it)
    granted: datetime | None
    released: datetime | None
    units: float
    busy_hours: float
    release_reason: str | None
    waited_for: str | None  # quota / no_capacity / fairness / headroom, from ``queued``
    workload: str | None = None  # a job's or kernel's class (a hub server's: none)

    @property
    def units_f(self) -> float:
        """The units it was granted (as the lease row names them, for ``lease_figures``)."""
        return self.units

    def wait(self, end: datetime) -> float:
        """Seconds it waited: to its grant, to its withdrawal, or (still waiting) to ``end``."""
        stop = self.granted or self.released or end
        return max(0.0, (min(stop, end) - self.created).total_seconds())


def queued_at(row: orm.LeaseRow) -> datetime | None:
    """When a request joined the queue: when it was asked or, for one that awaited an
    administrator, when it was approved. None for one that never did (denied, withdrawn or
    lapsed while awaiting, or awaiting still): it held nothing and waited for a person, not for
    capacity, so it is neither demand to replay nor a queue wait."""
    ask = row.approval or {}
    if not ask:
        return row.created
    decided = (
        parse_time(ask.get("decided"), lenient=True) if ask.get("decision") == "approved" else None
    )
    return None if decided is None else from_epoch(decided.timestamp())


class PlanningStore(ChargebackStore):
    """Recorded demand, per offer and day."""

    def records(self, start: datetime, end: datetime) -> list[Record]:
        """Requests asked within [start, end), and those asked earlier still held or waiting
        at ``start``, oldest first."""
        with self.read() as db:
            rows = list(
                db.scalars(
                    select(orm.LeaseRow)
                    .where(
                        orm.LeaseRow.created < end,
                        or_(
                            orm.LeaseRow.created >= start,
                            orm.LeaseRow.released.is_(None),
                            orm.LeaseRow.released > start,
                        ),
                    )
                    .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
                )
            )
            reasons: dict[str, str] = {}
            ids = [r.id for r in rows]
            for i in range(0, len(ids), 500):
                for lease_id, data in db.execute(
                    select(orm.EventRow.lease_id, orm.EventRow.data).where(
                        orm.EventRow.kind == "queued", orm.EventRow.lease_id.in_(ids[i : i + 500])
                    )
                ):
                    reasons.setdefault(lease_id, (data or {}).get("reason") or "no_capacity")
        return [
            Record(
                r.id,
                r.user,
                r.server,
                r.offer,
                r.group,
                tuple(r.groups or ()),
                tuple(r.clusters or ()),
                r.priority,
                queued,
                r.granted,
                r.released,
                r.units_f,
                r.busy_hours,
                r.release_reason,
                reasons.get(r.id),
                r.workload,
            )
            for r in rows
            if (queued := queued_at(r)) is not None
        ]

    def record_refusal(self, offer: str, code: str) -> bool:
        """Count a request refused outright with ``code`` (one row per day, offer and code,
        so a flood of refusals adds no rows); False for codes planning does not count."""
        if code not in QUOTA_REFUSALS + CAPACITY_REFUSALS or not offer:
            return False
        now = self.clock()
        row = {"day": datetime(now.year, now.month, now.day), "offer": offer[:64], "code": code}
        with self.writing() as db:
            t = orm.RefusalRow.__table__.c
            stmt = upsert_insert(db, orm.RefusalRow).values(**row, count=1)
            db.execute(
                stmt.on_conflict_do_update(
                    index_elements=[t.day, t.offer, t.code], set_={"count": t.count + 1}
                )
            )
        return True

    def _refusals(
        self, start: datetime, end: datetime, offer: str | None
    ) -> dict[tuple[str, datetime], tuple[int, int]]:
        """(refused by quota, refused by capacity) per (offer, day) within [start, end)."""
        out: dict[tuple[str, datetime], tuple[int, int]] = {}
        with self.read() as db:
            query = select(orm.RefusalRow).where(
                orm.RefusalRow.day >= datetime(start.year, start.month, start.day),
                orm.RefusalRow.day < end,
            )
            if offer is not None:
                query = query.where(orm.RefusalRow.offer == offer)
            for r in db.scalars(query):
                quota, capacity = out.get((r.offer, r.day), (0, 0))
                if r.code in QUOTA_REFUSALS:
                    quota += r.count
                else:
                    capacity += r.count
                out[(r.offer, r.day)] = (quota, capacity)
        return out

    def first_request(self) -> datetime | None:
        """When the first recorded request was made (None: none yet)."""
        with self.read() as db:
            return db.scalar(select(orm.LeaseRow.created).order_by(orm.LeaseRow.created).limit(1))

    def capacity(
        self, start: datetime, end: datetime, offer: str | None = None
    ) -> tuple[CapacityDayView, ...]:
        """Per offer and UTC day within [start, end), by offer then day: requests, demand
        (unit-hours held plus unit-hours waited), held, busy and idle unit-hours, the idle
        share, the p50/p95 queue wait of the day's requests, how many waited for quota and for
        capacity, and how many were refused outright by quota and by capacity."""
        if end <= start:
            raise StoreError("invalid_range", "'to' must be after 'from'", field="to")
        if end - start > timedelta(days=366):
            raise StoreError("invalid_range", "at most 366 days at a time", field="from")
        now = min(self.clock(), end)
        with self.locked(fresh=False) as alloc:
            units = {
                name: float(alloc.units_for(o, None) or Fraction(0))
                for name, o in alloc.offers.items()
            }
        day0 = datetime(start.year, start.month, start.day)
        days = []
        d = day0
        while d < end:
            days.append(d)
            d += DAY
        acc: dict[tuple[str, datetime], DayCell] = {}

        def cell(o: str, day: datetime) -> DayCell:
            return acc.setdefault((o, day), DayCell())

        records = self.records(start, end)
        busy_time = self.busy_time((r.id for r in records if r.granted), start, end)
        for rec in records:
            if offer is not None and rec.offer != offer:
                continue
            u = rec.units or units.get(rec.offer, 0.0)
            for day in days:
                lo, hi = max(day, start), min(day + DAY, end)
                if rec.granted is not None:
                    held, busy = lease_figures(rec, busy_time.get(rec.id, {}), lo, hi, now)
                    if held:
                        c = cell(rec.offer, day)
                        c.held += float(held)
                        c.busy += float(busy)
                wait_to = min(rec.granted or rec.released or now, hi)
                waited = (wait_to - max(rec.created, lo)).total_seconds()
                if waited > 0:
                    cell(rec.offer, day).waiting += waited / 3600 * u
            if rec.created >= start:
                day = datetime(rec.created.year, rec.created.month, rec.created.day)
                c = cell(rec.offer, day)
                c.requests += 1
                c.waits.append(rec.wait(now))
                if rec.waited_for == "quota":
                    c.quota += 1
                elif rec.waited_for is not None:
                    c.capacity += 1
        refused = self._refusals(start, end, offer)
        for key in refused:
            cell(*key)
        return tuple(
            capacity_day_view(o, day, c, refused.get((o, day), (0, 0)))
            for (o, day), c in sorted(acc.items(), key=lambda kv: (kv[0][0], kv[0][1]))
        )

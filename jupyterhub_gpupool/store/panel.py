"""What the admin panel and the user page read beyond the plain views: the pool map (cached by
pool version) and its headroom, the live leases with their idle time, units held and queued
over time, a user's last 30 days, the quota table and the effect of a quota change, as read
models (``read.poolmap``, ``read.headroom``, ``read.panel``; the service writes their JSON).
Read-only: nothing here writes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, cast, func, select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.facts import PoolState
from ..pool.leases import LIVE_STATES
from ..pool.rules.quotas import quota_preview
from .poolmap import MapParts
from .read.headroom import HeadroomView, headroom_view
from .read.panel import (
    DayUseView,
    LiveLeaseView,
    QuotaEffectView,
    QuotaUseView,
    UnitSeriesView,
    day_uses,
    live_lease_view,
    unit_series_view,
)
from .read.poolmap import MapRepartitionView, PoolMapView, PreemptingView
from .rows import check_quota_kind
from .usagefacts import BusyTimeStore, span_of

#: Re-partitions not finished yet.
OPEN = ("waiting", "applying")
#: Held while a map is looked up or built (``PanelViews.map_view``).
_MAP_LOCK = threading.Lock()


def _job_name(lease_id: Any) -> Any:
    """The name of the job holding the lease (NULL for a server's lease), as a column ``job``:
    the panel names a job's lease by its job, not by its ``job:<id>`` server."""
    q = select(orm.JobRow.name).where(orm.JobRow.lease_id == lease_id).limit(1)
    return q.scalar_subquery().label("job")


class PanelViews(BusyTimeStore):
    """The panel's reads."""

    # -- the map ---------------------------------------------------------------------------

    def live_leases(self) -> list[LiveLeaseView]:
        """Every live lease as the lease table shows it (one query)."""
        now = self._now_s()
        with self.read() as db:
            rows = db.execute(
                select(
                    orm.LeaseRow.id,
                    orm.LeaseRow.user,
                    orm.LeaseRow.server,
                    orm.LeaseRow.offer,
                    orm.LeaseRow.state,
                    orm.LeaseRow.units_f,
                    orm.LeaseRow.borrowed,
                    orm.LeaseRow.node,
                    orm.LeaseRow.granted,
                    orm.LeaseRow.activated,
                    orm.LeaseRow.reclaim_state,
                    orm.LeaseRow.reclaim_kind,
                    orm.LeaseRow.reclaim_deadline,
                    orm.LeaseRow.reclaim_reason,
                    orm.LeaseRow.reclaim_acting,
                    orm.LeaseRow.workload,
                    _job_name(orm.LeaseRow.id),
                ).where(orm.LeaseRow.state.in_(LIVE_STATES))
            ).all()
            preempting = self._preempting(db)
        return [live_lease_view(r, now, preempting.get(r.id)) for r in rows]

    def unit_series(self, start: datetime, end: datetime, step: float) -> UnitSeriesView:
        """GPU units held and waited for at each ``step`` from ``start`` to ``end`` (from the
        leases' grant, release and queue times: the history needs no table of its own)."""
        with self.read() as db:
            rows = db.execute(
                select(
                    orm.LeaseRow.units_f,
                    orm.LeaseRow.created,
                    orm.LeaseRow.queued_since,
                    orm.LeaseRow.granted,
                    orm.LeaseRow.released,
                ).where(
                    orm.LeaseRow.created < end,
                    (orm.LeaseRow.released.is_(None)) | (orm.LeaseRow.released > start),
                )
            ).all()
        return unit_series_view(rows, start, end, step)

    def user_history(self, user: str, days: int = 30) -> tuple[DayUseView, ...]:
        """The user's GPU unit-hours per day over the last ``days`` days: held, and busy (the
        share of a lease's busy hours that falls in the day)."""
        now = self.clock()
        first = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
        with self.read() as db:
            rows = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.user == user,
                    orm.LeaseRow.granted.is_not(None),
                    (orm.LeaseRow.released.is_(None)) | (orm.LeaseRow.released > first),
                )
            ).all()
        busy = self.busy_time((r.id for r in rows), first, now)
        return day_uses([(r, span_of(r)) for r in rows], busy, first, now, days)

    # -- the quota page --------------------------------------------------------------------

    def quota_table(self) -> list[QuotaUseView]:
        """Every user and group with a quota or live leases: the quota in effect, where it
        comes from, and the units held and borrowed now."""
        with self.locked() as alloc, self.read() as db:
            rows = db.scalars(select(orm.QuotaRow).where(orm.QuotaRow.kind != "default")).all()
            names = {(r.kind, r.name) for r in rows}
            borrowed: dict[tuple[str, str], float] = {}
            for lease in alloc.leases.values():
                names.add(("user", lease.request.user))
                if lease.group:
                    names.add(("group", lease.group))
                if lease.borrowed:
                    key = ("user", lease.request.user)
                    borrowed[key] = borrowed.get(key, 0.0) + float(lease.units)
            out = []
            for kind, name in sorted(names, key=lambda k: (k[0] != "group", k[1])):
                q = self.get_quota(kind + "s", name)
                held = alloc.quotas.held(name) if kind == "user" else alloc.quotas.group_held(name)
                out.append(QuotaUseView(q, float(held), borrowed.get((kind, name), 0.0)))
            return out

    def quota_effect(self, kind: str, name: str, raw: Mapping[str, object]) -> QuotaEffectView:
        """What changing a quota (the fields of ``raw`` over the one in effect) would do now,
        changing nothing: ``decide`` of the edit (``pool.rules.quotas.quota_preview``) with its
        effects read and discarded: which live leases would become borrowed or within
        guarantee, and how far over the limit."""
        current = self.get_quota(kind, name)
        k = check_quota_kind(kind)
        with self.locked() as alloc:
            state = PoolState(alloc, quota=current)
            spec, become_borrowed, become_within = quota_preview(state, kind, name, raw)
            book = alloc.quotas
            held = book.held(name) if k == "user" else book.group_held(name)
            over = max(0.0, float(held) - float(spec.limit)) if spec.limit is not None else 0.0
        return QuotaEffectView(
            kind=k,
            name=name,
            quota=spec,
            held=float(held),
            become_borrowed=tuple(become_borrowed),
            become_within=tuple(become_within),
            over_limit_by=over,
        )

    # -- the map, cached by pool version ------------------------------------------------------

    @staticmethod
    def _preempting(db: Session) -> dict[str, PreemptingView]:
        """The preemption notices of the ``preempting`` jobs by lease id: a job's own notice,
        which its lease does not carry (a class's preemption is no lease notice: no reclaimer
        enforces it, no user extends it). Few rows, by the jobs' state index."""
        J = orm.JobRow.__table__.c
        rows = db.connection().execute(
            select(J.lease_id, J.notice_deadline, J.reason).where(
                J.state == "preempting", J.lease_id.is_not(None)
            )
        )
        return {lid: PreemptingView(dl, reason) for lid, dl, reason in rows}

    def map_view(self) -> PoolMapView:
        """The pool map (every cluster, node, GPU and slice with its holder; every live lease;
        totals): kept until the pool version moves (every decision, inventory, node action
        and reclaim round bumps it), so a refresh of an unchanged pool costs a lookup and
        answers the very same view; after a change only the GPUs and leases that changed are
        built again, the others are the same objects as before (``poolmap.MapParts``)."""
        with _MAP_LOCK:  # one build at a time: the builds share the parts
            with self.locked() as alloc:
                version = self._version
                cached: PoolMapView | None = getattr(self, "_map_cache", None)
                if cached is not None and version is not None and cached.version == version:
                    return cached
                parts = getattr(self, "_map_parts", None)
                if parts is None:
                    parts = self._map_parts = MapParts()
                with self.read() as db:
                    open_reps = {
                        r.gpu_uuid: MapRepartitionView(r.id, r.state)
                        for r in db.scalars(
                            select(orm.MigRepartitionRow).where(
                                orm.MigRepartitionRow.state.in_(OPEN)
                            )
                        )
                    }
                inventory = parts.inventory(alloc, open_reps)
            with self.read() as db:  # the allocator is free again: decisions may go on
                # Core, times and JSON as text: thousands of rows without per-value processing,
                # read as they come (none is kept unless it changed)
                T = orm.LeaseRow.__table__.c
                rows = db.connection().execute(
                    select(
                        T.id,
                        T.user,
                        T.server,
                        T.offer,
                        T.state,
                        T.units_f,
                        T.borrowed,
                        cast(func.coalesce(T.activated, T.granted), String),
                        cast(T.reclaim_state, String),
                        T.reclaim_kind,
                        cast(T.reclaim_deadline, String),
                        T.reclaim_acting.is_not(None),
                        T.workload,
                        _job_name(T.id),
                    ).where(T.state.in_(LIVE_STATES))
                )
                view = parts.view(
                    version,
                    inventory,
                    itertools.chain.from_iterable(rows.partitions(500)),
                    self._preempting(db),
                )
            self._map_cache = view
            return view

    def headroom(self, *, fresh: bool = True) -> HeadroomView:
        """The headroom now (``read.headroom``): by the clock, so never kept with the map (a
        waiter ages past the classes never preempted while the pool version stands still).
        ``fresh=False`` for the metrics, which may be ``view_lag`` behind (``locked``)."""
        with self.locked(fresh=fresh) as alloc:
            return headroom_view(alloc, self.clock())

"""What the admin panel and the user page read beyond the plain views: the pool map (cached by
pool version), the live leases with their idle time, units held and queued over time, a user's
last 30 days, the quota table and the effect of a quota change. Read-only: nothing here writes.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import String, cast, func, select

from .. import orm
from ..pool.facts import PoolState
from ..pool.leases import LIVE_STATES
from ..pool.rules.quotas import quota_preview
from ..pool.usage import line_item, unpriced
from ..pool.workloads import INTERACTIVE
from .poolmap import MapText
from .rows import check_quota_kind, epoch, held_hours, ts
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

    def live_leases(self) -> dict[str, dict[str, Any]]:
        """Every live lease as the map and the lease table show it (one query)."""
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
        out = {}
        for r in rows:
            counts = r.reclaim_state or {}
            idle_since = counts.get("gpu_idle_since") or counts.get("idle_since")
            since = r.activated or r.granted
            out[r.id] = {
                "id": r.id,
                "user": r.user,
                "server": r.server,
                "offer": r.offer,
                "state": r.state,
                "units": r.units_f,
                "borrowed": r.borrowed,
                "node": r.node,
                "class": r.workload or INTERACTIVE,
                "job": r.job,
                "since": ts(since),
                "age_s": round(now - epoch(since), 1) if since else 0.0,
                "idle_s": round(now - idle_since, 1) if idle_since else 0.0,
                "notice": None
                if r.reclaim_kind is None
                else {
                    "kind": r.reclaim_kind,
                    "deadline": ts(r.reclaim_deadline),
                    "reason": r.reclaim_reason,
                    "acting": r.reclaim_acting is not None,
                },
            }
        return out

    def unit_series(
        self, start: datetime, end: datetime, step: float
    ) -> tuple[list[float], list[float]]:
        """GPU units held and waited for at each ``step`` from ``start`` to ``end`` (from the
        leases' grant, release and queue times: the history needs no table of its own)."""
        t0, t1 = epoch(start), epoch(end)
        n = int((t1 - t0) // step) + 1
        used, queued = [0.0] * n, [0.0] * n
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
        return [round(u, 4) for u in used], [round(q, 4) for q in queued]

    def user_history(self, user: str, days: int = 30) -> list[dict[str, Any]]:
        """The user's GPU unit-hours per day over the last ``days`` days: held, and busy (the
        share of a lease's busy hours that falls in the day)."""
        now = self.clock()
        first = (now - timedelta(days=days - 1)).replace(hour=0, minute=0, second=0, microsecond=0)
        out: list[dict[str, Any]] = [
            {"day": (first + timedelta(days=i)).date().isoformat(), "held": 0.0, "busy": 0.0}
            for i in range(days)
        ]
        with self.read() as db:
            rows = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.user == user,
                    orm.LeaseRow.granted.is_not(None),
                    (orm.LeaseRow.released.is_(None)) | (orm.LeaseRow.released > first),
                )
            ).all()
        busy = self.busy_time((r.id for r in rows), first, now)
        for row in rows:
            assert row.granted is not None
            span = span_of(row)
            for i, day in enumerate(out):
                start = first + timedelta(days=i)
                stop = min(start + timedelta(days=1), now)
                if held_hours(row, start, stop):
                    item = line_item(span, busy.get(row.id, {}), start, stop, now, unpriced)
                    day["held"] += float(item.held)
                    day["busy"] += float(item.busy)
        for day in out:
            day["held"], day["busy"] = round(day["held"], 3), round(day["busy"], 3)
        return out

    # -- the quota page --------------------------------------------------------------------

    def quota_table(self) -> list[dict[str, Any]]:
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
                out.append(
                    {
                        "name": q.name,
                        "kind": q.kind,
                        "source": q.source,
                        **q.spec.to_dict(),
                        "held": float(held),
                        "borrowed_units": borrowed.get((kind, name), 0.0),
                    }
                )
            return out

    def quota_effect(self, kind: str, name: str, raw: Mapping[str, object]) -> dict[str, Any]:
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
        return {
            "kind": k,
            "name": name,
            "quota": spec.to_dict(),
            "held": float(held),
            "become_borrowed": become_borrowed,
            "become_within": become_within,
            "over_limit_by": over,
        }

    # -- the map, cached by pool version ------------------------------------------------------

    def map_view(self) -> tuple[int | None, str]:
        """The pool map as JSON text (every cluster, node, GPU and slice with its holder; every
        live lease; totals): kept until the pool version moves (every decision, inventory,
        node action and reclaim round bumps it), so a refresh of an unchanged pool costs a
        lookup; after a change only the GPUs and leases that changed are encoded again
        (``poolmap.MapText``). Times are epochs: the reader subtracts them from now."""
        with _MAP_LOCK:  # one build at a time: the builds share the encoded parts
            with self.locked() as alloc:
                version = self._version
                cached: tuple[int | None, str] | None = getattr(self, "_map_cache", None)
                if cached is not None and version is not None and cached[0] == version:
                    return cached
                text = getattr(self, "_map_text", None)
                if text is None:
                    text = self._map_text = MapText()
                with self.read() as db:
                    open_reps = {
                        r.gpu_uuid: {"id": r.id, "state": r.state}
                        for r in db.scalars(
                            select(orm.MigRepartitionRow).where(
                                orm.MigRepartitionRow.state.in_(OPEN)
                            )
                        )
                    }
                inventory = text.inventory(alloc, open_reps)
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
                body = text.document(
                    version, inventory, itertools.chain.from_iterable(rows.partitions(500))
                )
            self._map_cache = (version, body)
            return self._map_cache

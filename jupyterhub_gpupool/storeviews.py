"""Read-only views of the pool for the API: inventory, the audit log, usage reports.

``Store`` mixes this in: the methods use its allocator (``locked``) and read sessions; they
never take the pool lock or write.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import func, or_, select

from . import orm
from .pool.model import RETIRING


def _ts(dt: datetime | None) -> str | None:
    return (
        None if dt is None else dt.replace(tzinfo=timezone.utc).isoformat().replace("+00:00", "Z")
    )


class StoreViews:
    """Inventory, events and usage (part of ``Store``)."""

    clock: Callable[[], datetime]
    locked: Callable[..., Any]
    read: Callable[..., Any]
    _instance_state: Callable[..., str]

    def pool(self, *, detail: bool) -> dict[str, Any]:
        """Inventory: admins get holders per GPU; users get aggregates only."""
        with self.locked() as alloc:
            holders: dict[str, list[dict[str, Any]]] = {}
            if detail:
                for lease in alloc.leases.values():
                    for s in lease.slots:
                        holders.setdefault(s.gpu, []).append(
                            {
                                "lease": lease.id,
                                "user": lease.request.user,
                                "kind": s.kind,
                                "profile": s.profile,
                                "start": s.start,
                                "milli": s.milli,
                            }
                        )
            clusters: dict[str, list[dict[str, Any]]] = {}
            for node in alloc.nodes.values():
                gpus = []
                for g in node.gpus:
                    free = g.free_units() if node.schedulable else 0.0
                    if detail:
                        gpus.append(
                            {
                                "uuid": g.uuid,
                                "index": g.index,
                                "model": g.model.name,
                                "mig_enabled": g.mig_enabled,
                                "dynamic_mig": g.dynamic_mig,
                                "healthy": g.healthy,
                                "cordoned": g.cordoned,
                                "free_units": free,
                                "instances": [
                                    {
                                        "profile": i.profile,
                                        "start": i.start,
                                        "uuid": i.uuid,
                                        "lease": None if i.lease == RETIRING else i.lease,
                                        "state": self._instance_state(g, i),
                                    }
                                    for i in g.instances
                                ],
                                "holders": holders.get(g.uuid, []),
                            }
                        )
                if detail:
                    clusters.setdefault(node.cluster, []).append(
                        {
                            "name": node.name,
                            "cordoned": node.cordoned,
                            "draining": node.draining,
                            "cpu_milli": node.cpu_milli,
                            "memory_mib": node.memory_mib,
                            "cpu_used": node.cpu_used,
                            "memory_used": node.memory_used,
                            "gpus": gpus,
                        }
                    )
            out: dict[str, Any] = {
                "totals": dict(alloc.capacity()),
                "models": list(alloc.capacity_by_model().values()),
                "queue_length": len(alloc.waiters),
            }
            if detail:
                out["clusters"] = [{"name": c, "nodes": n} for c, n in clusters.items()]
            return out

    def events(
        self,
        *,
        offset: int = 0,
        limit: int = 200,
        lease: str | None = None,
        user: str | None = None,
    ) -> tuple[list[dict[str, Any]], int]:
        """Audit events, oldest first."""
        with self.read() as db:
            q = select(orm.EventRow)
            if lease is not None:
                q = q.where(orm.EventRow.lease_id == lease)
            if user is not None:
                q = q.where(orm.EventRow.user == user)
            total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
            rows = db.scalars(q.order_by(orm.EventRow.id).offset(offset).limit(limit))
            return [
                {
                    "id": e.id,
                    "ts": _ts(e.ts),
                    "actor": e.actor,
                    "kind": e.kind,
                    "lease": e.lease_id,
                    "user": e.user,
                    "data": e.data,
                }
                for e in rows
            ], total

    def usage(self, start: datetime, end: datetime, by: str) -> list[dict[str, Any]]:
        """Unit-hours held and busy per user, group or offer within [start, end)."""
        from .store import StoreError

        if by not in ("user", "group", "offer"):
            raise StoreError(
                400,
                "invalid_by",
                f"cannot group usage by {by!r}",
                field="by",
                allowed=["user", "group", "offer"],
            )
        if end <= start:
            raise StoreError(400, "invalid_range", "'to' must be after 'from'", field="to")
        with self.read() as db:
            rows = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.granted.is_not(None),
                    orm.LeaseRow.granted < end,
                    or_(orm.LeaseRow.released.is_(None), orm.LeaseRow.released > start),
                )
            )
            acc: dict[str, dict[str, Any]] = {}
            now = self.clock()
            for row in rows:
                key = getattr(row, by) or ""
                held = _held_hours(row, start, min(end, now))
                span = _held_hours(row, row.granted, row.released or now)
                busy = row.busy_hours * (held / span) if span else 0.0
                a = acc.setdefault(
                    key, {by: key, "leases": 0, "held_unit_hours": 0.0, "busy_unit_hours": 0.0}
                )
                a["leases"] += 1
                a["held_unit_hours"] += held
                a["busy_unit_hours"] += busy * row.units_f
            for a in acc.values():
                a["held_unit_hours"] = round(a["held_unit_hours"], 6)
                a["busy_unit_hours"] = round(a["busy_unit_hours"], 6)
            return sorted(acc.values(), key=lambda a: a[by])


def _held_hours(row: orm.LeaseRow, start: datetime, end: datetime) -> float:
    """Unit-hours ``row`` was held within [start, end)."""
    if row.granted is None:
        return 0.0
    a = max(row.granted, start)
    b = min(row.released or end, end)
    return max(0.0, (b - a).total_seconds() / 3600.0) * row.units_f

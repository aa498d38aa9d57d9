"""Read-only views for the API: leases, offers, a user's page, the inventory, the audit log
and usage reports. They never take the pool lock or write; they read the allocator held still
(``locked``) and read-only sessions."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool.allocator import Allocator
from ..pool.approval import LIMIT_CODES
from ..pool.errors import ConfigError
from ..pool.model import Offer
from ..pool.queue import estimate_wait
from ..pool.reclaimpolicy import PolicySet, parse_policies
from .core import StoreCore
from .errors import StoreError
from .read.events import EventView, event_view
from .read.leases import LeaseView, ReclaimView, lease_view, reclaim_view
from .read.poolmap import PoolView, pool_view
from .read.quotas import QuotaView, quota_view
from .rows import check_quota_kind, mig_devices, offer_spec

log = logging.getLogger("jupyterhub_gpupool.store")


class EveryHub:
    """The type of ``EVERY_HUB``."""

    def __repr__(self) -> str:
        return "EVERY_HUB"


#: A lease filter's ``hub`` meaning "whichever hub the lease came from" (None is the pool's
#: own hub).
EVERY_HUB = EveryHub()


#: Lease holders kept in memory for the scope checks (``ViewStore.note_holder``).
HOLDERS_KEPT = 100_000


class ViewStore(StoreCore):
    """The store's read side."""

    # -- leases ------------------------------------------------------------------------------

    def lease(self, lease_id: str) -> LeaseView:
        """One lease."""
        with self.locked() as alloc, self.read() as db:
            return self._lease_view(db, alloc, self.lease_row(db, lease_id))

    def lease_holder(self, lease_id: str) -> tuple[str, str | None]:
        """The user a lease belongs to and the hub it came from (None: the pool's own), for
        scope checks. Neither ever changes, so an answer is kept (see ``note_holder``)."""
        holders = self._lease_holders
        if lease_id in holders:
            return holders[lease_id]
        with self.read() as db:  # two columns, not the row and its slots
            found = db.execute(
                select(orm.LeaseRow.user, orm.LeaseRow.hub).where(orm.LeaseRow.id == lease_id)
            ).first()
        if found is None:
            raise StoreError("not_found", f"no lease {lease_id!r}", field="id")
        self.note_holder(lease_id, found[0], found[1])
        return found[0], found[1]

    def note_holder(self, lease_id: str, user: str, hub: str | None) -> None:
        """Remember whose a lease is, as the service learns it (its grant's answer): every
        DELETE asks, and a database read for it on the event loop cost a round trip per
        release. Bounded: the oldest go first (a forgotten one is read again)."""
        holders = self._lease_holders
        holders[lease_id] = (user, hub)
        while len(holders) > HOLDERS_KEPT:
            del holders[next(iter(holders))]

    def leases(
        self,
        *,
        user: str | None = None,
        state: str | None = None,
        offset: int = 0,
        limit: int = 200,
        hub: str | EveryHub | None = EVERY_HUB,
    ) -> tuple[list[LeaseView], int]:
        """Leases, newest first, filtered (``hub``: only those from that hub; None: the pool's
        own); returns (page, total)."""
        if state is not None and state not in orm.LEASE_STATES:
            raise StoreError(
                "invalid_state",
                f"unknown state {state!r}",
                field="state",
                allowed=orm.LEASE_STATES,
            )
        with self.locked() as alloc, self.read() as db:
            q = select(orm.LeaseRow)
            if user is not None:
                q = q.where(orm.LeaseRow.user == user)
            if state is not None:
                q = q.where(orm.LeaseRow.state == state)
            if not isinstance(hub, EveryHub):
                q = q.where(orm.LeaseRow.hub.is_(None) if hub is None else orm.LeaseRow.hub == hub)
            total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
            rows = list(
                db.scalars(
                    q.order_by(orm.LeaseRow.created.desc(), orm.LeaseRow.id)
                    .offset(offset)
                    .limit(limit)
                    .options(selectinload(orm.LeaseRow.slots))
                )
            )
            # queue positions and release rates once per page, not once per queued lease
            positions: dict[str, int] | None = None
            rates: dict[str, float] | None = None
            if any(r.state == "queued" for r in rows):
                now = self._now_s()
                positions = {w.request.id: i for i, w in enumerate(alloc.queue(now), 1)}
                rates = {}
            return [self._lease_view(db, alloc, r, positions, rates) for r in rows], total

    def _lease_view(
        self,
        db: Session,
        alloc: Allocator | None,
        row: orm.LeaseRow,
        positions: Mapping[str, int] | None = None,
        rates: dict[str, float] | None = None,
        now: float | None = None,
    ) -> LeaseView:
        """``row``'s view (``read.leases.lease_view``) with what it reads from the store: the
        release rates (kept in ``rates`` across a page) and the offers' reclaim policies.
        ``now``: the time the caller decided at, if it did (None: now)."""

        def release_rate(offer: str) -> float:
            if rates is None:
                return self._release_rate(db, offer)
            if offer not in rates:
                rates[offer] = self._release_rate(db, offer)
            return rates[offer]

        return lease_view(
            alloc,
            row,
            now=self._now_s() if now is None else now,
            release_rate=release_rate,
            max_extensions=lambda offer: self._max_extensions(db, alloc, offer),
            positions=positions,
        )

    def _reclaim_view(self, db: Session, alloc: Allocator | None, row: orm.LeaseRow) -> ReclaimView:
        """The notice of a ``reclaiming`` lease as the user and the reclaimer see it."""
        return reclaim_view(row, self._max_extensions(db, alloc, row.offer))

    def _max_extensions(self, db: Session, alloc: Allocator | None, offer: str) -> int:
        """``offer``'s reclaim policy's most extensions of a notice."""
        offers = alloc.offers if alloc is not None else {}
        policy = self.reclaim_policies(db, offers).for_offer(offers.get(offer) or offer)
        return policy.max_extensions

    def reclaim_section(self, db: Session) -> tuple[dict[str, Any] | None, str]:
        """The ``reclaim`` section in effect as written, and where it comes from: ``api`` (the
        admin's override), ``file`` (the pool config) or ``default`` (none: the defaults)."""
        row = db.get(orm.ReclaimPolicyRow, 1)
        if row is not None:
            return dict(row.spec), "api"
        section = self.file_config.reclaim_section
        return (dict(section), "file") if section else (None, "default")

    def reclaim_policies(self, db: Session, offers: Mapping[str, Offer]) -> PolicySet:
        """The effective reclaim policies against today's offers (parsed once per change).

        An override (or file section) that no longer validates (an offer it names was removed)
        gives way to the next: the file's section, then the defaults.
        """
        section, _ = self.reclaim_section(db)
        key = (section, dict(offers))
        cached: tuple[object, PolicySet] | None = getattr(self, "_policy_cache", None)
        if cached is not None and cached[0] == key:
            return cached[1]
        candidates = [section, self.file_config.reclaim_section, None]
        for candidate in candidates:
            try:
                policies = parse_policies(candidate, offers, catalog=self.catalog)
                break
            except ConfigError as e:
                log.warning("The reclaim policies no longer fit the offers (%s): falling back", e)
        else:  # pragma: no cover - the defaults always parse
            policies = PolicySet()
        self._policy_cache = (key, policies)
        return policies

    #: A live lease's MIG instances: (GPU, start) → (``MIG-…`` uuid, whether it exists).
    _mig_devices = staticmethod(mig_devices)

    def _release_rate(self, db: Session, offer: str) -> float:
        """Releases of ``offer`` in the last hour: the basis of queue wait estimates."""
        since = self.clock() - timedelta(hours=1)
        return float(
            db.scalar(
                select(func.count())
                .select_from(orm.LeaseRow)
                .where(
                    orm.LeaseRow.offer == offer,
                    orm.LeaseRow.released >= since,
                    orm.LeaseRow.granted.is_not(None),
                )
            )
            or 0
        )

    # -- offers and users ------------------------------------------------------------------

    def check_clusters(self, clusters: Iterable[str], field: str) -> None:
        """A StoreError (``unknown_cluster``, the known ones allowed) for a cluster the pool
        config does not list."""
        known = self.file_config.clusters
        for c in clusters:
            if c not in known:
                raise StoreError(
                    "unknown_cluster",
                    f"unknown cluster {c!r}: the pool knows {', '.join(known)}",
                    field=field,
                    allowed=list(known),
                )

    def offers_for(
        self, user: str | None, groups: Iterable[str], clusters: Iterable[str] = ()
    ) -> list[dict[str, Any]]:
        """Offers visible to ``user`` with live availability, queue length, units and quota fit;
        for a hub launching into ``clusters`` only the offers it can serve, counted there."""
        groups, clusters = list(groups), tuple(clusters)
        with self.locked() as alloc, self.read() as db:
            out = []
            for offer in alloc.offers.values():
                if user is not None and not offer.visible_to(groups):
                    continue
                if offer.served_in(clusters) == frozenset():
                    continue
                units = alloc.units_for(offer, None)
                queue = sum(1 for w in alloc.waiters.values() if w.request.offer == offer.name)
                verdict = alloc.quotas.check(user, groups, units) if user else None
                # beyond the limit, but an exception (with a reason and a duration) may be asked
                exception_ok = (
                    user is not None
                    and verdict is not None
                    and verdict.code in LIMIT_CODES
                    and alloc.quotas.check(user, groups, units, exception=True).can_wait
                )
                available = alloc.available(offer, clusters=clusters)
                eta = (
                    0.0
                    if available and not queue
                    else estimate_wait(queue + 1, self._release_rate(db, offer.name))
                )
                out.append(
                    {
                        **offer_spec(offer),
                        "units": float(units),
                        "available": available,
                        "queue_length": queue,
                        "quota_ok": None if verdict is None else verdict.ok,
                        "quota_reason": None if verdict is None or verdict.ok else verdict.code,
                        "exception_ok": exception_ok,
                        "eta_seconds": eta,
                    }
                )
            return out

    def get_quota(self, kind: str, name: str) -> QuotaView:
        """A user's or group's effective quota and where it comes from: their own row, else
        for a user the default's, else none."""
        k = check_quota_kind(kind)
        with self.read() as db:
            row = db.scalar(
                select(orm.QuotaRow).where(orm.QuotaRow.kind == k, orm.QuotaRow.name == name)
            )
            if row is None and kind == "users":
                row = db.scalar(select(orm.QuotaRow).where(orm.QuotaRow.kind == "default"))
                src = "default" if row is not None else "none"
            else:
                src = row.source if row else "none"
            return quota_view(k, name, row, src)

    # -- the pool --------------------------------------------------------------------------

    def pool(self, *, detail: bool) -> PoolView:
        """Inventory: admins get holders per GPU; users get aggregates only."""
        with self.locked() as alloc:
            return pool_view(alloc, detail=detail)

    # -- the audit log and usage ---------------------------------------------------------------

    def events(
        self,
        *,
        offset: int = 0,
        limit: int = 200,
        lease: str | None = None,
        user: str | None = None,
        kind: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        newest_first: bool = False,
    ) -> tuple[list[EventView], int]:
        """Audit events, oldest first (or newest first), filtered by lease, the lease's user,
        kind and time (``since`` inclusive, ``until`` exclusive)."""
        with self.read() as db:
            q = select(orm.EventRow)
            if lease is not None:
                q = q.where(orm.EventRow.lease_id == lease)
            if user is not None:
                q = q.where(orm.EventRow.user == user)
            if kind is not None:
                q = q.where(orm.EventRow.kind == kind)
            if since is not None:
                q = q.where(orm.EventRow.ts >= since)
            if until is not None:
                q = q.where(orm.EventRow.ts < until)
            total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
            order = orm.EventRow.id.desc() if newest_first else orm.EventRow.id
            rows = db.scalars(q.order_by(order).offset(offset).limit(limit))
            return [event_view(e) for e in rows], total

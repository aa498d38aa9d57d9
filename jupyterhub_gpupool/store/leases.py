"""The lease lifecycle: ask, bind, resize, release, and the housekeeping that keeps it moving
(expiring unbound grants, serving the queue, reconciling with the hub)."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.decide import Holder, PoolState
from ..pool.leases import LIVE_STATES, is_ready
from .apply import RESTARTING, TARGET_STATES, Applier, decided
from .bulk import staged_lease
from .errors import StoreError
from .views import ViewStore


class LeaseStore(Applier, ViewStore):
    """Leases: every method decides in one transaction and answers the lease JSON."""

    def allocate(
        self,
        user: str,
        server: str,
        offer: str,
        *,
        group: str | None = None,
        groups: Iterable[str] = (),
        priority: int | None = None,
        actor: str = "",
        resize_of: str | None = None,
        clusters: Iterable[str] = (),
        reason: str = "",
        duration: float | None = None,
        hub: str | None = None,
        check_cap: bool = True,
        replicas: int = 1,
    ) -> dict[str, Any]:
        """Ask for ``offer`` for ``user``'s ``server``: a granted or queued lease, one awaiting
        an administrator's approval, or StoreError.

        ``clusters``: where the asking hub can launch (empty: anywhere); each must be one the
        pool config lists. ``reason`` and ``duration`` (seconds) make an ask for approval: an
        offer with ``approval: required`` needs a reason; a request beyond the quota's limit
        with a reason (and a duration) is an exception request, up to the exception ceiling.
        ``hub``: the hub asking (None: the pool's own; else its spawner service's name), kept
        on the lease. ``resize_of``: the lease this one will replace (a resize target; it
        counts toward ``max_requests_per_user`` like any request, unless ``check_cap`` is off:
        the reclaimer's own shrink). ``replicas``: copies of the offer in the one grant (a
        job's, checked by ``workloads.check_replicas``).
        """
        clusters = tuple(dict.fromkeys(clusters))
        self.check_clusters(clusters, "clusters")
        command = c.Allocate(
            user,
            server,
            offer,
            group=group,
            groups=groups,
            priority=priority,
            resize_of=resize_of,
            clusters=clusters,
            reason=reason,
            duration=duration,
            hub=hub,
            check_cap=check_cap,
            replicas=replicas,
        )
        with self.transaction() as (db, alloc):
            awaiting = self.awaiting_requests(db, user)
            state = PoolState(
                alloc,
                holder=self._server_holder(db, alloc, user, server, awaiting),
                awaiting=len(awaiting),
                request_cap=self.max_requests_per_user,
                new_id=uuid.uuid4().hex,
            )
            outcome = decided(state, command, self._now_s())
            made = self._apply_effects(db, alloc, outcome.effects, actor)
            return self._lease_json(db, alloc, made[outcome.answer])

    def _server_holder(
        self, db: Session, alloc: Allocator, user: str, server: str, awaiting: dict[str, str]
    ) -> Holder | None:
        """The lease or request ``user``'s ``server`` already has (live or queued, from the
        allocator, made earlier in the same batch too; or awaiting approval), with its hub."""
        found = alloc.lease_for_server(user, server) or next(
            ((lid, "awaiting_approval") for lid, its in awaiting.items() if its == server), None
        )
        if found is None:
            return None
        return Holder(found[0], found[1], self._hub_of(db, found[0]))

    @staticmethod
    def _hub_of(db: Session, lease_id: str) -> str | None:
        """The hub of a lease (made earlier in this batch too)."""
        staged = staged_lease(db, lease_id)
        if staged is not None:
            return staged.hub
        for obj in db.new:
            if isinstance(obj, orm.LeaseRow) and obj.id == lease_id:
                return obj.hub
        return db.scalar(select(orm.LeaseRow.hub).where(orm.LeaseRow.id == lease_id))

    def release(self, lease_id: str, *, reason: str = "stopped", actor: str = "") -> dict[str, Any]:
        """End a lease (or leave the queue) and serve the queue with what it frees."""
        if reason not in orm.RELEASE_REASONS:
            raise StoreError(
                "invalid_reason",
                f"unknown release reason {reason!r}",
                field="reason",
                allowed=orm.RELEASE_REASONS,
            )
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            facts, rows = self._lease_facts(db, alloc, [row])
            command = c.Release(lease_id, reason)
            outcome = decided(PoolState(alloc, facts), command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, rows)
            return self._lease_json(db, alloc, row)

    def keepalive(self, lease_id: str, *, actor: str = "") -> dict[str, Any]:
        """The server is running on its lease: bind a grant (granted → active), note liveness.

        Binding the new lease of a resize releases the old one (make-before-break).
        """
        now = self.clock()
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            if row.state in ("awaiting_approval", "queued", "released"):
                raise StoreError("not_live", f"lease {lease_id} is {row.state}", field="id")
            made = (exists for _, exists in self._mig_devices(alloc, row).values())
            if row.state == "granted" and not is_ready(row.state, made):
                # dynamic MIG: nothing to run on yet (the lease says ready once there is)
                raise StoreError(
                    "not_ready",
                    f"lease {lease_id} waits for its MIG instance to be made; bind it once "
                    "the lease is ready",
                    field="id",
                )
            row.keepalive = now
            if row.state == "granted":
                row.state, row.activated, row.expires = "active", now, None
                self._event(db, "activated", actor, row)
                if row.resize_of:
                    old = db.get(orm.LeaseRow, row.resize_of)
                    if old is not None and old.state != "released":
                        self._finish(db, alloc, old, "resized", actor)
            return self._lease_json(db, alloc, row)

    def resize(
        self, lease_id: str, offer: str, *, actor: str = "", check_cap: bool = True
    ) -> dict[str, Any]:
        """Reserve ``offer`` for the lease's server; the old lease stays until the new one binds.

        A lease has at most one live target (queued, awaiting approval or granted): a second
        resize is ``resize_pending``; a target cannot itself be resized before it is bound
        (``resize_target``), so targets never chain. ``commands.Resize`` is not batchable: it
        runs in a transaction of its own, after every earlier resize committed, so the query
        below sees every target there is. The target counts toward the per-user cap (``check_cap``).
        """
        with self.transaction() as (db, _):
            row = self.lease_row(db, lease_id)
            if row.resize_of is not None and row.state != "released":
                original = db.get(orm.LeaseRow, row.resize_of)
                if original is not None and original.state != "released":
                    raise StoreError(
                        "resize_target",
                        f"lease {lease_id} is the pending resize of lease {row.resize_of}: "
                        "resize that one, or wait until this one is bound",
                        field="id",
                    )
            if row.state not in LIVE_STATES:
                raise StoreError("not_live", f"lease {lease_id} is {row.state}", field="id")
            if offer == row.offer:
                raise StoreError(
                    "same_offer", f"lease {lease_id} already has {offer!r}", field="offer"
                )
            pending = self.target_of(db, lease_id)
            if pending is not None:
                raise StoreError(
                    "resize_pending",
                    f"lease {lease_id} already has resize {pending.id} pending",
                    field="id",
                )
            return self.allocate(
                row.user,
                row.server,
                offer,
                group=row.group,
                groups=row.groups or (),
                actor=actor,
                resize_of=lease_id,
                clusters=row.clusters or (),
                hub=row.hub,  # the restart into it is that hub's
                check_cap=check_cap,
            )

    @staticmethod
    def target_of(db: Session, lease_id: str) -> orm.LeaseRow | None:
        """The live resize target of a lease (queued, awaiting approval or granted), if any."""
        return db.scalar(
            select(orm.LeaseRow)
            .where(
                orm.LeaseRow.resize_of == lease_id,
                orm.LeaseRow.state.in_(TARGET_STATES),
            )
            .limit(1)
        )

    def mark_restarting(self, lease_id: str, *, actor: str = "") -> dict[str, Any]:
        """The service is restarting the server into this granted target: the release of
        the lease it replaces (the server's stop) then leaves the target alone."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            if row.state == "granted" and row.resize_of is not None:
                row.reason = RESTARTING
            return self._lease_json(db, alloc, row)

    def expire_grants(self) -> int:
        """Release grants no server bound in time; returns how many."""
        now = self.clock()
        with self.transaction() as (db, alloc):
            expired = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.state == "granted", orm.LeaseRow.expires < now
                )
            ).all()
            facts, rows = self._lease_facts(db, alloc, expired)
            outcome = decided(PoolState(alloc, facts), c.ExpireGrants(), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, "system", rows)
            return int(outcome.answer)

    def reconcile(
        self,
        running: set[tuple[str, str]],
        *,
        actor: str = "system",
        reason: str = "stopped",
        older_than: datetime | None = None,
        deleted: Iterable[tuple[str, str]] = (),
    ) -> int:
        """Release leases (``reason``) and end queue entries (``cancelled``) of servers the hub
        no longer runs or spawns, and withdraw requests awaiting approval for the ``deleted``
        servers (user, server) the hub no longer has at all (a server that is only stopped
        keeps its request: it starts on the lease once approved). With ``older_than``, only
        those made before it: a request the spawner just made may come before the hub lists
        its server as spawning. Returns how many were released, withdrawn ones included.

        Only the pool's own hub's leases (``hub`` None): ``running`` is what that hub lists,
        which says nothing of another hub's servers (that hub's spawner releases its leases
        when it stops them; an unbound grant expires)."""
        deleted = set(deleted)
        with self.transaction() as (db, alloc):
            states = ("queued", *LIVE_STATES, *(("awaiting_approval",) if deleted else ()))
            query = (
                select(orm.LeaseRow)
                .where(orm.LeaseRow.state.in_(states), orm.LeaseRow.hub.is_(None))
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)  # the audit log's order
            )
            if older_than is not None:
                query = query.where(orm.LeaseRow.created < older_than)
            gone = [
                r
                for r in db.scalars(query).all()
                if (
                    (r.user, r.server) in deleted
                    if r.state == "awaiting_approval"
                    else (r.user, r.server) not in running
                )
            ]
            for row in gone:
                why = {"queued": "cancelled", "awaiting_approval": "withdrawn"}.get(row.state)
                self._finish(db, alloc, row, why or reason, actor)
            self._event(db, "reconciled", actor, data={"released": len(gone)})
            return len(gone)

    def promote(self) -> int:
        """Serve the queue (after aging, say); returns how many were granted."""
        with self.transaction() as (db, alloc):
            outcome = decided(PoolState(alloc), c.Promote(), self._now_s())
            self._apply_effects(db, alloc, outcome.effects)
            return int(outcome.answer)

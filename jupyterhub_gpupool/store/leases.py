"""The lease lifecycle: ask, bind, resize, release, and the housekeeping that keeps it moving
(expiring unbound grants, serving the queue). Each method reads the facts its command's rule
needs, asks ``pool.decide`` and applies the effects; the hub's reconcile, which also reads the
jobs' liveness, is ``JobStore.reconcile``."""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.facts import Holder, PoolState
from ..pool.leases import LIVE_STATES, is_ready
from .apply import TARGET_STATES, Applier, decided, lease_facts
from .bulk import staged_lease
from .errors import StoreError
from .read.leases import LeaseView
from .rows import lease_info
from .views import ViewStore


class LeaseStore(Applier, ViewStore):
    """Leases: every method decides in one transaction and answers the lease (``LeaseView``)."""

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
    ) -> LeaseView:
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
            state, now = self._ask_state(db, alloc, user, server), self._now_s()
            outcome = decided(state, command, now)
            made = self._apply_effects(db, alloc, outcome.effects, actor, now_s=now)
            return self._lease_view(db, alloc, made[outcome.answer], now=now)

    def _ask_state(
        self, db: Session, alloc: Allocator, user: str, server: str, **more: Any
    ) -> PoolState:
        """What a new request for ``user``'s ``server`` reads (a server's, a job's, a
        kernel's): the lease or request the server has, the user's requests awaiting
        approval and the cap, the new request's id; ``more``: the asker's own facts."""
        awaiting = self.awaiting_requests(db, user)
        return PoolState(
            alloc,
            holder=self._server_holder(db, alloc, user, server, awaiting),
            awaiting=len(awaiting),
            request_cap=self.max_requests_per_user,
            new_id=uuid.uuid4().hex,
            **more,
        )

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

    def release(self, lease_id: str, *, reason: str = "stopped", actor: str = "") -> LeaseView:
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
            command, now = c.Release(lease_id, reason), self._now_s()
            outcome = decided(PoolState(alloc, facts), command, now)
            self._apply_effects(db, alloc, outcome.effects, actor, rows, now)
            return self._lease_view(db, alloc, row, now=now)

    def keepalive(self, lease_id: str, *, actor: str = "") -> LeaseView:
        """The lease's server runs: bind a grant (granted → active), note liveness; binding
        the new lease of a resize releases the old one (make-before-break). On a lease under
        notice, the user's "keep my GPU": extends within the policy's extensions, or refuses
        (``extension_limit``, ``not_extendable``, and ``reclaim_in_progress`` once a round
        claimed the action). A job's lease refuses (``job_lease``). ``pool.decide`` decides."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            made = (exists for _, exists in self._mig_devices(alloc, row).values())
            facts, known = {lease_id: lease_facts(row)}, {lease_id: row}
            old = db.get(orm.LeaseRow, row.resize_of) if row.resize_of else None
            if old is not None and row.state == "granted":  # its bind ends the lease it replaces
                more, read = self._lease_facts(db, alloc, [old])
                facts, known = {**more, **facts}, {**read, **known}
            facts[lease_id] = replace(facts[lease_id], ready=is_ready(row.state, made))
            policy = None
            if row.state == "reclaiming" and row.reclaim_kind is not None:
                facts[lease_id] = replace(facts[lease_id], reclaim=lease_info(row))
                offer = alloc.offers.get(row.offer)
                policy = self.reclaim_policies(db, alloc.offers).for_offer(offer or row.offer)
            state = PoolState(alloc, facts, policy=policy)
            outcome = decided(state, c.Keepalive(lease_id), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, known)
            return self._lease_view(db, alloc, row)

    def resize(
        self, lease_id: str, offer: str, *, actor: str = "", check_cap: bool = True
    ) -> LeaseView:
        """Reserve ``offer`` for the lease's server; the old lease stays until the new one binds
        (``pool.decide``: a new request, ``resize_of`` the lease).

        A lease has at most one live target (queued, awaiting approval or granted): a second
        resize is ``resize_pending``; a target cannot itself be resized before it is bound
        (``resize_target``), so targets never chain; a job's lease refuses (``job_lease``).
        ``commands.Resize`` is not batchable: it runs in a transaction of its own, after every
        earlier resize committed, so the query below sees every target there is. The target
        counts toward the per-user cap (``check_cap``).
        """
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            rows = [row]
            original = db.get(orm.LeaseRow, row.resize_of) if row.resize_of else None
            if original is not None:
                rows.append(original)
            facts = {r.id: lease_facts(r) for r in rows}
            if row.state in LIVE_STATES:
                self.check_clusters(tuple(row.clusters or ()), "clusters")
            awaiting = self.awaiting_requests(db, row.user)
            pending = self.target_of(db, lease_id)
            state = PoolState(
                alloc,
                facts,
                awaiting=len(awaiting),
                request_cap=self.max_requests_per_user,
                new_id=uuid.uuid4().hex,
                resize_pending=pending.id if pending is not None else None,
            )
            outcome = decided(state, c.Resize(lease_id, offer, check_cap), self._now_s())
            made = self._apply_effects(db, alloc, outcome.effects, actor)
            return self._lease_view(db, alloc, made[outcome.answer])

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

    def mark_restarting(self, lease_id: str, *, actor: str = "") -> LeaseView:
        """The service is restarting the server into this granted target: the release of
        the lease it replaces (the server's stop) then leaves the target alone."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            facts = {lease_id: lease_facts(row)}
            outcome = decided(PoolState(alloc, facts), c.MarkRestarting(lease_id), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor or "system", {lease_id: row})
            return self._lease_view(db, alloc, row)

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

    def promote(self) -> int:
        """Serve the queue (after aging, say); returns how many were granted."""
        with self.transaction() as (db, alloc):
            outcome = decided(PoolState(alloc), c.Promote(), self._now_s())
            self._apply_effects(db, alloc, outcome.effects)
            return int(outcome.answer)

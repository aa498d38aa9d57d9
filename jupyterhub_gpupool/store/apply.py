"""The one applier: the allocator's decisions become rows and audit events here, and only here.

A decision is made in memory (``pool.allocator``); what it means for the rows is written by
``_record`` (a grant: state, slots, the MIG instances the pool plans for it; a queued request:
its reason and place) and by ``_finish`` (a release, the grants it lets the queue have, and the
owner's leases whose ``borrowed`` flag the release changed). Every caller that decides (allocate,
release, promote, uncordon, quota edits, MIG results, inventory) goes through them.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.allocator import Allocator, Grant, Lease, Queued
from .bulk import queue_release
from .core import StoreCore
from .rows import new_row

#: States of a resize target that still stands (``LeaseRow.resize_of`` names its lease).
TARGET_STATES = ("awaiting_approval", "queued", "granted", "active", "reclaiming")
#: ``LeaseRow.reason`` of a granted target the service is restarting the server into.
RESTARTING = "restarting"


class Applier(StoreCore):
    """Writes decisions into rows (the store's part every deciding module shares)."""

    def _record(
        self, db: Session, row: orm.LeaseRow, decision: Grant | Queued, actor: str = ""
    ) -> None:
        """Write ``decision`` about ``row``'s request into the rows and the audit log."""
        now = self.clock()
        if isinstance(decision, Queued):
            row.state, row.reason, row.message = "queued", decision.reason, decision.message
            row.queued_since, row.within_guarantee = now, decision.within_guarantee
            self._event(
                db,
                "queued",
                actor or row.user,
                row,
                {"reason": decision.reason, "position": decision.position},
            )
            return
        grant = decision
        row.state, row.reason, row.message = "granted", None, None
        row.granted, row.node, row.group = now, grant.node, grant.group
        row.units, row.units_f, row.borrowed = str(grant.units), float(grant.units), grant.borrowed
        row.expires = now + timedelta(seconds=self.grant_timeout)
        for slot in grant.slots:
            gpu = self._allocator.gpus.get(slot.gpu) if self._allocator else None
            row.model = gpu.model.name if gpu is not None else row.model
            if slot.create:  # the pool plans a new MIG instance: record it with the GPU
                gpu_row = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == slot.gpu))
                if gpu_row is not None:
                    gpu_row.instances.append(
                        orm.MigInstanceRow(profile=slot.profile, start=slot.start)
                    )
            row.slots.append(
                new_row(
                    orm.LeaseSlotRow,
                    slot_key=slot.key,
                    gpu_uuid=slot.gpu,
                    kind=slot.kind,
                    profile=slot.profile,
                    start=slot.start,
                    milli=slot.milli,
                    create=slot.create,
                    live=True,
                )
            )
        self._event(
            db,
            "granted",
            "system",
            row,
            {
                "node": grant.node,
                "offer": row.offer,
                "waited": _waited(row, now),
                "slots": [s.key for s in grant.slots],
            },
        )

    def _record_grants(self, db: Session, grants: Iterable[Grant]) -> int:
        """Write grants the allocator made to waiters (their rows exist); returns how many."""
        n = 0
        for grant in grants:
            waiter = self.pending_or_stored(db, grant.request.id)
            if waiter is not None:
                self._record(db, waiter, grant)
                n += 1
        return n

    def _serve_queue(self, db: Session, alloc: Allocator) -> int:
        """Grant what the queue can have now; returns how many were granted."""
        return self._record_grants(db, alloc.promote(self._now_s()))

    def _record_borrowed(self, db: Session, leases: Iterable[Lease]) -> None:
        """Persist re-derived ``borrowed`` flags (audited as borrowed / within-guarantee)."""
        for lease in leases:
            row = self.pending_or_stored(db, lease.id)
            if row is not None and row.borrowed != lease.borrowed:
                row.borrowed = lease.borrowed
                self._event(db, "borrowed" if row.borrowed else "within-guarantee", "system", row)

    def _finish(
        self, db: Session, alloc: Allocator | None, row: orm.LeaseRow, reason: str, actor: str
    ) -> None:
        """Release ``row`` for ``reason``. With ``alloc`` (a deciding transaction), the
        allocator releases it too and what it frees goes to the queue; without (the allocator
        is rebuilt from the rows afterwards), only the rows change."""
        was = row.state
        # a lease that ends (not by its target's bind) takes its pending target with it
        cascade = reason != "resized" and alloc is not None and was != "released"
        if row.reclaim_acting is not None and reason in ("stopped", "resized", "orphaned"):
            # the reclaim's own stop (or its shrink's bind) ends the lease: say why it ended,
            # whoever releases it first
            reason = row.reclaim_release or "reclaimed-idle"
        now = self.clock()
        if not queue_release(db, row, now, reason):  # else written with the batch's others
            row.state, row.released, row.release_reason = "released", now, reason
            row.reclaim_deadline = None
            for s in row.slots:
                s.live = False
        for s in row.slots:
            if s.create:  # a MIG instance the pool made for this lease goes with it
                gpu = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == s.gpu_uuid))
                if gpu is not None:
                    gpu.instances = [i for i in gpu.instances if i.start != s.start]
                    # delete now: a grant later in the same batch may plan an instance here
                    db.flush()
        self._event(db, "released", actor, row, {"reason": reason, "from": was})
        if alloc is None:
            return
        related = alloc.leases_of(row.user, row.group)
        borrowed_before = {lid: lease.borrowed for lid, lease in related.items()}
        if row.id in alloc.leases or row.id in alloc.waiters:
            self._record_grants(db, alloc.release(row.id, self._now_s()))
        else:
            self._serve_queue(db, alloc)
        # what the owner still holds may now be within guarantee (the allocator re-derived it)
        self._record_borrowed(
            db,
            (
                lease
                for lid, was_borrowed in borrowed_before.items()
                if (lease := alloc.leases.get(lid)) is not None and lease.borrowed != was_borrowed
            ),
        )
        if cascade:
            for target in self._pending_targets(db, alloc, row):
                if target.state == "granted" and (
                    target.reason == RESTARTING or target.id == row.reclaim_target
                ):
                    continue  # the server stops to restart into it: it binds it next
                why = {"queued": "cancelled", "awaiting_approval": "withdrawn"}.get(
                    target.state, reason
                )
                self._finish(db, alloc, target, why, actor)

    def _pending_targets(
        self, db: Session, alloc: Allocator, row: orm.LeaseRow
    ) -> list[orm.LeaseRow]:
        """``row``'s resize targets not yet bound. A target is the same server's, so only the
        owner's other leases and requests of that server are looked at (from the allocator
        and the batch's awaiting requests, no query unless there is one)."""
        user, server = row.user, row.server
        ids = [
            lid
            for lid, lease in alloc.leases_of(user).items()
            if lid != row.id and lease.request.server == server
        ]
        ids += [
            lid
            for lid, waiter in alloc.waiters.items()
            if lid != row.id and waiter.request.user == user and waiter.request.server == server
        ]
        ids += [
            lid
            for lid, its_server in self.awaiting_requests(db, user).items()
            if lid != row.id and its_server == server
        ]
        found = []
        for lid in dict.fromkeys(ids):
            target = self.lease_row(db, lid)
            if target.resize_of == row.id and target.state in (
                "awaiting_approval",
                "queued",
                "granted",
            ):
                found.append(target)
        return found


def _waited(row: orm.LeaseRow, now: datetime) -> float | None:
    return (now - row.queued_since).total_seconds() if row.queued_since else None

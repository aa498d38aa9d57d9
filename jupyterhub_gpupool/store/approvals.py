"""Approvals: an administrator's decision on a request awaiting approval, and the lapse of what
was approved for a while.

A request waits in ``awaiting_approval`` holding nothing (``pool.approval`` says when). An
approval puts it in the normal queue, possibly for a shorter duration or a smaller offer of the
same kind; a denial ends it (``denied``); the user may withdraw it (``DELETE``: ``withdrawn``).
An approved duration lapses: the lease gets an ``exception`` notice ``warn_before`` ahead (no
keepalive extends it; an admin may), the reclaimer (or, without one, the service) ends it at the
deadline with reason ``lapsed``; a request still queued when its duration ends is ``lapsed``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.errors import Refusal
from ..pool.facts import Lapsing, PoolState
from ..pool.leases import LIVE_STATES
from ..pool.reclaim import ReclaimState
from ..pool.rules.approvals import approval_note, denial_reason
from .apply import LazyFacts, decided, lease_facts
from .errors import StoreError
from .labelmig import LabelMigStore
from .read.leases import LeaseView
from .rebuild import request_of
from .rows import epoch, reclaim_state


class ApprovalStore(LabelMigStore):
    """Approve, deny, and lapse what was approved for a duration."""

    def approve(
        self,
        lease_id: str,
        *,
        duration: float | None = None,
        offer: str | None = None,
        note: str = "",
        actor: str = "",
    ) -> LeaseView:
        """Approve a waiting request: it joins the queue (or is granted now). ``duration`` may
        only shorten what was asked; ``offer`` may only be a smaller one of the same kind
        (``pool.decide`` decides)."""
        try:
            approval_note(note, duration)  # before the lease is looked up, as the API answers
        except Refusal as e:
            raise StoreError(e.code, e.message, field=e.field) from None
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            asked = (row.approval or {}).get("duration")
            state = PoolState(
                alloc,
                {row.id: lease_facts(row)},
                request=request_of(row) if row.state == "awaiting_approval" else None,
                asked_duration=asked if row.state == "awaiting_approval" else None,
            )
            command = c.Approve(lease_id, duration, offer, note)
            outcome = decided(state, command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, {row.id: row})
            return self._lease_view(db, alloc, row)

    def deny(self, lease_id: str, reason: object, *, actor: str = "") -> LeaseView:
        """Deny a waiting request with a reason the user sees: it ends (``denied``;
        ``pool.decide`` decides)."""
        try:
            said = denial_reason(reason)  # before the lease is looked up, as the API answers
        except Refusal as e:
            raise StoreError(e.code, e.message, field=e.field) from None
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            facts, rows = self._lease_facts(db, alloc, [row])
            command = c.Deny(lease_id, said)
            outcome = decided(PoolState(alloc, facts), command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, rows)
            return self._lease_view(db, alloc, row)

    def awaiting_approval(self) -> list[LeaseView]:
        """Every request waiting for a decision, oldest first (the admins' list)."""
        with self.read() as db:
            rows = db.scalars(
                select(orm.LeaseRow)
                .where(orm.LeaseRow.state == "awaiting_approval")
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
            ).all()
            return [self._lease_view(db, None, r) for r in rows]

    def lapse_approvals(self) -> tuple[int, int]:
        """Housekeeping (``pool.decide``): a live lease whose approved duration ends within its
        ``warn_before`` gets an ``exception`` notice ending then; a request still waiting in the
        queue, or a grant never bound, when its duration ends is released ``lapsed``.
        (noticed, lapsed)."""
        with self.transaction() as (db, alloc):
            rows = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.lapses.is_not(None),
                    orm.LeaseRow.state.in_(("queued", *LIVE_STATES)),
                )
            ).all()
            lapsing, facts = [], {}
            for row in rows:
                assert row.lapses is not None
                bound = row.state not in ("queued", "granted")
                facts[row.id] = lease_facts(row)
                deadline = row.reclaim_deadline
                lapsing.append(
                    Lapsing(
                        facts[row.id],
                        epoch(row.lapses),
                        self._warn_before(db, alloc, row) if bound else 0.0,
                        reclaim_state(row) if bound else ReclaimState(),
                        None if deadline is None else epoch(deadline),
                    )
                )
            lazy = LazyFacts(self, db, alloc, rows)  # a lapsed one's pending targets go along
            state = PoolState(alloc, lazy, lapsing=tuple(lapsing))
            outcome = decided(state, c.LapseApprovals(), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, "system", lazy.read)
            noticed, lapsed = outcome.answer
            return int(noticed), int(lapsed)

    def _warn_before(self, db: Session, alloc: Any, row: orm.LeaseRow) -> float:
        offer = alloc.offers.get(row.offer)
        return self.reclaim_policies(db, alloc.offers).for_offer(offer or row.offer).warn_before

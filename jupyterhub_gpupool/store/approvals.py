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

from dataclasses import replace
from datetime import timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool.approval import MAX_REASON, AskError, check_ask
from ..pool.decisions import Grant, Rejected
from ..pool.effects import LeaseGranted, LeaseQueued
from ..pool.leases import LIVE_STATES
from .errors import StoreError
from .labelmig import LabelMigStore
from .rebuild import request_of
from .rows import ts


class ApprovalStore(LabelMigStore):
    """Approve, deny, and lapse what was approved for a duration."""

    @staticmethod
    def _awaiting(row: orm.LeaseRow) -> dict[str, Any]:
        """The row's ask, or 409 ``not_awaiting_approval`` (withdrawn, decided, never asked)."""
        if row.state != "awaiting_approval":
            was = f"{row.state} ({row.release_reason})" if row.release_reason else row.state
            raise StoreError(
                "not_awaiting_approval",
                f"lease {row.id} is {was}: there is no request to decide",
                field="id",
            )
        return dict(row.approval or {})

    def approve(
        self,
        lease_id: str,
        *,
        duration: float | None = None,
        offer: str | None = None,
        note: str = "",
        actor: str = "",
    ) -> dict[str, Any]:
        """Approve a waiting request: it joins the queue (or is granted now). ``duration`` may
        only shorten what was asked; ``offer`` may only be a smaller one of the same kind."""
        try:
            note = check_ask(note, duration)
        except AskError as e:
            field = "note" if e.field == "reason" else e.field
            raise StoreError(e.code, e.message, field=field) from None
        now = self.clock()
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            ask = self._awaiting(row)
            asked = ask.get("duration")
            if duration is not None and asked is not None and duration > asked:
                raise StoreError(
                    "invalid_field",
                    f"an approval may shorten the duration asked ({asked:g} s), not lengthen it",
                    field="duration",
                )
            duration = duration if duration is not None else asked
            request = request_of(row)
            if offer is not None and offer != row.offer:
                self._check_smaller(alloc, row.offer, offer)
                request = replace(request, offer=offer)
            decision = alloc.decide(request, self._now_s())
            if isinstance(decision, Rejected):  # nothing changed: it still awaits a decision
                raise StoreError(
                    decision.code,
                    f"{decision.message} (the request still awaits a decision)",
                    field=decision.field,
                    allowed=decision.allowed,
                )
            ask.update(
                decision="approved",
                decided=ts(now),
                decided_by=actor,
                note=note or None,
                approved_duration=duration,
            )
            if request.offer != row.offer:
                ask["asked_offer"], row.offer = row.offer, request.offer
            row.approval = ask
            row.lapses = None if duration is None else now + timedelta(seconds=duration)
            row.units, row.units_f = str(decision.units), float(decision.units)
            self._event(
                db,
                "approved",
                actor,
                row,
                {"duration": duration, "offer": row.offer, "note": note or None},
            )
            joins = LeaseGranted(decision) if isinstance(decision, Grant) else LeaseQueued(decision)
            self._apply_effects(db, alloc, [joins], actor)
            return self._lease_json(db, alloc, row)

    def _check_smaller(self, alloc: Any, asked: str, offer: str) -> None:
        new, old = alloc.offers.get(offer), alloc.offers.get(asked)
        if new is None:
            raise StoreError(
                "unknown_offer",
                f"there is no offer {offer!r}",
                field="offer",
                allowed=list(alloc.offers),
            )
        smaller = [
            o.name
            for o in alloc.offers.values()
            if old is not None
            and o.kind == old.kind
            and o.name != old.name
            and alloc.units_for(o, None) < alloc.units_for(old, None)
        ]
        if offer not in smaller:
            raise StoreError(
                "invalid_field",
                f"an approval may lower the ask to a smaller offer of the same kind than "
                f"{asked!r}, not {offer!r}",
                field="offer",
                allowed=smaller,
            )

    def deny(self, lease_id: str, reason: object, *, actor: str = "") -> dict[str, Any]:
        """Deny a waiting request with a reason the user sees: it ends (``denied``)."""
        reason = reason.strip() if isinstance(reason, str) else ""
        if not reason:
            raise StoreError("missing_field", "say why the request is denied", field="reason")
        if len(reason) > MAX_REASON:
            raise StoreError("invalid_field", f"at most {MAX_REASON} characters", field="reason")
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            ask = self._awaiting(row)
            ask.update(decision="denied", decided=ts(self.clock()), decided_by=actor, note=reason)
            row.approval = ask
            row.message = f"denied: {reason}"
            self._event(db, "denied", actor, row, {"reason": reason})
            self._finish(db, alloc, row, "denied", actor)
            return self._lease_json(db, alloc, row)

    def awaiting_approval(self) -> list[dict[str, Any]]:
        """Every request waiting for a decision, oldest first (the admins' list)."""
        with self.read() as db:
            rows = db.scalars(
                select(orm.LeaseRow)
                .where(orm.LeaseRow.state == "awaiting_approval")
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)
            ).all()
            return [self._lease_json(db, None, r) for r in rows]

    def lapse_approvals(self) -> tuple[int, int]:
        """Housekeeping: a live lease whose approved duration ends within its ``warn_before``
        gets an ``exception`` notice ending then (never less than ``warn_before`` from when it
        is given: a notice always comes first); a request still waiting in the queue, or a
        grant never bound, when its duration ends is released ``lapsed``. (noticed, lapsed)."""
        now = self.clock()
        noticed = lapsed = 0
        with self.transaction() as (db, alloc):
            rows = db.scalars(
                select(orm.LeaseRow).where(
                    orm.LeaseRow.lapses.is_not(None),
                    orm.LeaseRow.state.in_(("queued", *LIVE_STATES)),
                )
            ).all()
            for row in rows:
                assert row.lapses is not None
                if row.state in ("queued", "granted"):
                    if row.lapses <= now:
                        self._finish(db, alloc, row, "lapsed", "system")
                        lapsed += 1
                    continue
                if row.reclaim_acting is not None or row.reclaim_kind == "exception":
                    continue
                warn = self._warn_before(db, alloc, row)
                if now < row.lapses - timedelta(seconds=warn):
                    continue
                deadline = max(row.lapses, now + timedelta(seconds=warn))
                earlier = row.reclaim_deadline
                if row.state == "reclaiming" and earlier is not None and earlier <= deadline:
                    continue  # an earlier notice stands; this one comes if it is kept
                ends = ts(row.lapses.replace(microsecond=0))  # to the second: people read it
                why = f"the approved time for this GPU ends at {ends}"
                self._admin_notice(db, alloc, row, "exception", deadline, "stop", why, "system")
                noticed += 1
            return noticed, lapsed

    def _warn_before(self, db: Session, alloc: Any, row: orm.LeaseRow) -> float:
        offer = alloc.offers.get(row.offer)
        return self.reclaim_policies(db, alloc.offers).for_offer(offer or row.offer).warn_before

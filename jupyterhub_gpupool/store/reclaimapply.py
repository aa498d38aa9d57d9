"""The one applier's part for reclaims and notices: the reclaim columns of a lease, the reclaim
policy's row and their audit events (``pool.effects``' "reclaim and notices" effects; the
allocator's part is ``pool.effects.apply_effect``). ``store/apply.py``'s ``_apply_effects``
calls it, in the effects' order, in the command's transaction."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy.orm import Session

from .. import orm
from ..pool.effects import (
    BudgetWarned,
    NoticeMoved,
    ReclaimCancelled,
    ReclaimClaimed,
    ReclaimCounted,
    ReclaimEnded,
    ReclaimNoticed,
    ReclaimPolicyReset,
    ReclaimPolicySet,
)
from ..timeparse import format_time
from .core import StoreCore
from .rows import event_data, from_epoch, set_reclaim_state

ReclaimEffect = (
    ReclaimCounted
    | ReclaimNoticed
    | ReclaimCancelled
    | ReclaimClaimed
    | ReclaimEnded
    | NoticeMoved
    | ReclaimPolicySet
    | ReclaimPolicyReset
    | BudgetWarned
)
#: The effects of reclaims and notices (``ReclaimApplier._reclaim_applied``).
RECLAIM_EFFECTS = (
    ReclaimCounted,
    ReclaimNoticed,
    ReclaimCancelled,
    ReclaimClaimed,
    ReclaimEnded,
    NoticeMoved,
    ReclaimPolicySet,
    ReclaimPolicyReset,
    BudgetWarned,
)


class ReclaimApplier(StoreCore):
    """Writes the reclaims' and notices' effects into rows."""

    def _reclaim_applied(
        self, db: Session, effect: ReclaimEffect, actor: str, known: Mapping[str, orm.LeaseRow]
    ) -> None:
        """A reclaim's or a notice's effect: the reclaim columns, the policy row, the audit."""
        if isinstance(effect, ReclaimPolicySet):
            policy = db.get(orm.ReclaimPolicyRow, 1)
            if policy is None:
                policy = orm.ReclaimPolicyRow(id=1)
                db.add(policy)
            policy.spec, policy.actor, policy.updated = dict(effect.section), actor, self.clock()
            self._event(db, "reclaim-policy-set", actor, data={"reclaim": dict(effect.section)})
            return
        if isinstance(effect, ReclaimPolicyReset):
            policy = db.get(orm.ReclaimPolicyRow, 1)
            if policy is not None:
                db.delete(policy)
            self._event(db, "reclaim-policy-reset", actor)
            return
        if isinstance(effect, BudgetWarned):
            self._event(db, "budget-warning", "system", data=event_data(effect.warning))
            return
        row = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
        if isinstance(effect, ReclaimCounted):
            set_reclaim_state(row, effect.state)
        elif isinstance(effect, ReclaimNoticed):
            rec = effect.state.reclaiming
            assert rec is not None
            set_reclaim_state(row, effect.state)
            row.state = "reclaiming"
            data: dict[str, Any] = {
                "kind": rec.kind,
                "deadline": format_time(from_epoch(rec.deadline)),
            }
            data |= {"reason": rec.reason, "action": rec.action, "pressure": rec.pressure}
            data |= {"for_request": rec.for_request, "evidence": effect.evidence}
            self._event(db, "reclaim-notice", actor, row, data)
        elif isinstance(effect, ReclaimCancelled):
            set_reclaim_state(row, effect.state)
            row.state = "active"
            said = {"reason": effect.reason, "evidence": effect.evidence}
            self._event(db, "reclaim-cancelled", actor, row, said)
        elif isinstance(effect, ReclaimClaimed):
            if effect.state is not None:
                set_reclaim_state(row, effect.state)
            row.reclaim_acting, row.reclaim_release = self.clock(), effect.release
            row.reclaim_target = effect.target
            self._event(db, "reclaim-acting", actor, row, event_data(effect.data))
        elif isinstance(effect, ReclaimEnded):
            if effect.unclaimed:
                row.reclaim_acting = None
            if effect.forgotten:
                row.reclaim_release = row.reclaim_target = None
            if effect.state is not None:
                set_reclaim_state(row, effect.state)
                row.state = "active"
            self._event(db, effect.kind, actor, row, dict(effect.data))
        elif isinstance(effect, NoticeMoved):
            rec = effect.state.reclaiming
            assert rec is not None
            set_reclaim_state(row, effect.state)
            moved: dict[str, Any] = {"by_admin": True, "seconds": effect.seconds}
            self._event(
                db,
                "reclaim-extended",
                actor,
                row,
                {**moved, "until": format_time(from_epoch(rec.deadline))},
            )

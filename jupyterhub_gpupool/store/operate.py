"""What the admin panel does to leases and nodes beyond the plain API: reclaim now, extend a
notice, drain by a deadline, re-partition a GPU's MIG layout, and the map's reads.

An admin's reclaim goes through the reclaimer like any other: a notice (kind ``admin``, or
``drain`` for a node drained by a deadline) is persisted on the lease with its deadline, the
user sees it on their page and in the lab, and the reclaimer's round acts on it at the
deadline (saving open documents first) and releases it with reason ``admin``. "Immediately"
skips the notice and releases at once. A grant not yet bound has no server to save: it is
released at once either way.

With no reclaimer running, nothing would act at the deadline: the pool service carries out an
admin or drain notice itself once it is overdue by a bound (``enforce_notices`` claims it the
way a reclaim round does, the service stops the server through the hub, ``notice_enforced``
releases the lease with reason ``admin``). A running reclaimer claims it first, at its next
round, and saves the user's work before the stop. Idle notices stay the reclaimer's.

A re-partition is a row (``MigRepartitionRow``) that waits, with the GPU cordoned, until no
lease holds what must go; then the wanted layout is written (dynamic-MIG GPUs: the instance
rows, which the node's agent gets through its ``mig-plan``) or handed to whoever applies the
node's ``nvidia.com/mig.config`` label (``method: label``); it is ``done`` when the node
reports the new layout. A drain and the re-partition commands are decided by ``pool.decide``
(``pool.rules.nodes``, ``pool.rules.mig``); the store gathers their facts and applies.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.effects import NoticeWithdrawn
from ..pool.ending import admin_notice
from ..pool.facts import MigGpu, PoolState, Repartition
from ..pool.leases import LIVE_STATES
from ..pool.reclaim import Reclaiming, enforced_release, withdraw
from ..pool.repartition import Held, delivery, parse_layout, plan_repartition
from ..pool.rules.nodes import ADMIN_ACTIONS as NOTICE_ACTIONS
from .admin import AdminStore
from .apply import decided, lease_facts
from .errors import StoreError
from .panel import OPEN, PanelViews
from .reclaim import ReclaimStore, outcome_data
from .rows import (
    epoch,
    from_epoch,
    node_json,
    reclaim_state,
    set_reclaim_state,
    ts,
)

#: What an admin's reclaim may do at its deadline.
ADMIN_ACTIONS = NOTICE_ACTIONS
#: The longest notice or extension an admin may give (a year, as for policies).
MAX_GRACE = 366 * 86400.0
#: Notices the pool service carries out itself once overdue (an idle notice needs the
#: reclaimer, which asks the lab to save everything first).
ENFORCED_KINDS = ("admin", "drain", "exception", "budget")


class OperateStore(PanelViews, ReclaimStore, AdminStore):
    """The admin panel's writes (its reads are ``PanelViews``)."""

    # -- reclaim now, extend ---------------------------------------------------------------

    def _admin_notice(
        self,
        db: Session,
        alloc: Allocator,
        row: orm.LeaseRow,
        kind: str,
        deadline: datetime,
        action: str,
        reason: str,
        actor: str,
    ) -> str:
        """Give ``row`` an admin notice, or release a grant not yet bound
        (``pool.ending.admin_notice``); what happened (``noticed`` or ``released``)."""
        if row.state == "granted":  # released: its pending targets go along
            facts, rows = self._lease_facts(db, alloc, [row])
        else:
            facts, rows = {row.id: lease_facts(row)}, {row.id: row}
        notice = Reclaiming(kind, epoch(deadline), reason, action, self._now_s())
        state, now = PoolState(alloc, facts), self._now_s()
        outcome = admin_notice(state, facts[row.id], reclaim_state(row), notice, now)
        self._apply_effects(db, alloc, outcome.effects, actor, rows)
        return str(outcome.answer)

    def admin_reclaim(
        self,
        lease_id: str,
        *,
        immediately: bool = False,
        grace: float | None = None,
        action: str = "stop",
        reason: str = "",
        actor: str = "",
    ) -> dict[str, Any]:
        """Reclaim a live lease: a notice ending in ``grace`` seconds (default: the offer's
        ``warn_before``), or (``immediately``) a release now with reason ``admin``."""
        if action not in ADMIN_ACTIONS:
            raise StoreError(
                "invalid_field", f"unknown action {action!r}", field="action", allowed=ADMIN_ACTIONS
            )
        if grace is not None and not 0 <= grace <= MAX_GRACE:
            raise StoreError("invalid_field", "must be 0 to 366 days in seconds", field="grace")
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            if row.state not in LIVE_STATES:
                raise StoreError(
                    "not_live",
                    f"lease {lease_id} is {row.state}: there is no GPU to reclaim",
                    field="id",
                )
            if row.reclaim_acting is not None and not immediately:
                raise StoreError(
                    "reclaim_in_progress",
                    f"lease {lease_id} is being reclaimed now ({row.reclaim_action})",
                    field="id",
                )
            if immediately:
                self._finish(db, alloc, row, "admin", actor)
                return self._lease_json(db, alloc, row)
            if grace is None:
                policy = self.reclaim_policies(db, alloc.offers).for_offer(
                    alloc.offers.get(row.offer) or row.offer
                )
                grace = policy.warn_before
            why = reason.strip() or f"an administrator ({actor or 'admin'}) reclaims this GPU"
            deadline = self.clock() + timedelta(seconds=grace)
            self._admin_notice(db, alloc, row, "admin", deadline, action, why, actor)
            return self._lease_json(db, alloc, row)

    def extend_notice(self, lease_id: str, seconds: float, *, actor: str = "") -> dict[str, Any]:
        """Push a reclaim notice's deadline ``seconds`` later (from now, if it has passed)."""
        if not 0 < seconds <= MAX_GRACE:
            raise StoreError("invalid_field", "must be 1 s to 366 days", field="seconds")
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            state = reclaim_state(row)
            if row.state != "reclaiming" or state.reclaiming is None:
                raise StoreError(
                    "no_notice", f"lease {lease_id} is under no reclaim notice", field="id"
                )
            if row.reclaim_acting is not None:
                raise StoreError(
                    "reclaim_in_progress",
                    f"lease {lease_id} is being reclaimed now: too late to extend",
                    field="id",
                )
            rec = state.reclaiming
            deadline = max(rec.deadline, self._now_s()) + seconds
            set_reclaim_state(row, replace(state, reclaiming=replace(rec, deadline=deadline)))
            self._event(
                db,
                "reclaim-extended",
                actor,
                row,
                {"by_admin": True, "seconds": seconds, "until": ts(from_epoch(deadline))},
            )
            return self._lease_json(db, alloc, row)

    # -- cancel a notice ---------------------------------------------------------------------

    def _withdraw(
        self, db: Session, alloc: Allocator, row: orm.LeaseRow, why: str, actor: str
    ) -> None:
        """End ``row``'s notice (the pool's ``withdraw`` rule) and audit it for the user."""
        state = reclaim_state(row)
        rec = state.reclaiming
        assert rec is not None
        policy = self.reclaim_policies(db, alloc.offers).for_offer(
            alloc.offers.get(row.offer) or row.offer
        )
        after = withdraw(state, self._now_s(), policy.extension)
        effect = NoticeWithdrawn(row.id, after, why, rec.kind, rec.reason)
        self._apply_effects(db, alloc, [effect], actor, {row.id: row})

    def cancel_notice(self, lease_id: str, reason: str = "", *, actor: str = "") -> dict[str, Any]:
        """An admin withdraws a lease's reclaim notice, whatever its kind (``no_notice`` when
        there is none; ``reclaim_in_progress`` once a round or the service claimed the
        action: too late)."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            if row.state != "reclaiming" or reclaim_state(row).reclaiming is None:
                raise StoreError(
                    "no_notice", f"lease {lease_id} is under no reclaim notice", field="id"
                )
            if row.reclaim_acting is not None:
                raise StoreError(
                    "reclaim_in_progress",
                    f"lease {lease_id} is being reclaimed now: too late to cancel its notice",
                    field="id",
                )
            who = actor.partition(":")[2] or actor or "admin"
            why = reason.strip() or f"an administrator ({who}) withdrew the notice"
            self._withdraw(db, alloc, row, why, actor)
            return self._lease_json(db, alloc, row)

    # -- overdue notices, carried out by the service ---------------------------------------

    def _overdue(self, db: Session, overdue: float) -> list[orm.LeaseRow]:
        """Live leases under an admin or drain notice whose deadline passed more than
        ``overdue`` seconds ago, and that no one is carrying out (a claim older than
        ``reclaim_claim_timeout`` is a claimer that died mid-action, as a round counts it).
        Not a job's lease: no hub server to stop; its runner stops the job (``store/jobs.py``)."""
        now = self.clock()
        rows = db.scalars(
            select(orm.LeaseRow)
            .where(
                orm.LeaseRow.state.in_(LIVE_STATES),
                orm.LeaseRow.holder.is_(None),
                orm.LeaseRow.reclaim_kind.in_(ENFORCED_KINDS),
                orm.LeaseRow.reclaim_deadline <= now - timedelta(seconds=overdue),
            )
            .order_by(orm.LeaseRow.reclaim_deadline, orm.LeaseRow.id)
        ).all()
        stale = now - timedelta(seconds=self.reclaim_claim_timeout)
        return [r for r in rows if r.reclaim_acting is None or r.reclaim_acting <= stale]

    def enforce_notices(self, overdue: float, *, actor: str = "") -> list[dict[str, Any]]:
        """Claim every admin or drain notice overdue by more than ``overdue`` seconds that no
        reclaimer acts on, for the caller to stop its server (then ``notice_enforced``).

        Claimed as a reclaim round claims an action (``reclaim_acting``, release reason
        ``admin``): a reclaimer's round and the user's keepalive then leave it alone, and the
        server's own stop releases it with that reason. Nothing overdue: nothing is written
        (the pool version stays, so the cached map and other replicas' allocators too).
        """
        if not 0 <= overdue <= MAX_GRACE:
            raise StoreError("invalid_field", "must be 0 to 366 days in seconds", field="overdue")
        with self.read() as db:
            if not self._overdue(db, overdue):
                return []
        out = []
        with self.transaction() as (db, _):
            for row in self._overdue(db, overdue):
                again = row.reclaim_acting is not None
                release = enforced_release(row.reclaim_kind or "admin")
                row.reclaim_acting, row.reclaim_release = self.clock(), release
                why = (
                    f"no reclaimer carried out the {row.reclaim_kind} notice within "
                    f"{overdue:g} s of its deadline: the pool service stops the server"
                )
                self._event(
                    db,
                    "reclaim-acting",
                    actor or "system",
                    row,
                    {
                        "kind": row.reclaim_kind,
                        "action": row.reclaim_action,
                        "reason": row.reclaim_reason,
                        "deadline": ts(row.reclaim_deadline),
                        "release_reason": release,
                        "enforced": why,
                        "again": again,
                    },
                )
                out.append(
                    {
                        "lease": row.id,
                        "user": row.user,
                        "server": row.server,
                        "kind": row.reclaim_kind,
                        "action": row.reclaim_action,
                        "deadline": ts(row.reclaim_deadline),
                        "reason": row.reclaim_reason,
                    }
                )
        return out

    def notice_enforced(
        self, lease_id: str, stopped: bool, detail: str = "", *, actor: str = ""
    ) -> dict[str, Any]:
        """The service stopped the server of a notice it claimed (``stopped``): the lease is
        released (reason ``admin``, if the server's stop has not released it already). Not
        stopped (the hub refused, or it did not stop in time): the claim stays, so the notice
        is tried again once the claim is older than ``reclaim_claim_timeout``."""
        with self.transaction() as (db, alloc):
            row = self.acting_row(db, lease_id)
            actor = actor or "system"
            data = outcome_data(row, "done" if stopped else "failed", detail)
            data["enforced"] = True
            if stopped:
                if row.state in LIVE_STATES:
                    self._finish(db, alloc, row, row.reclaim_release or "admin", actor)
                row.reclaim_acting = None
                self._event(db, "reclaimed", actor, row, data)
            else:
                self._event(db, "reclaim-failed", actor, row, data)
            return self._lease_json(db, alloc, row)

    # -- drain by a deadline ---------------------------------------------------------------

    def drain_node(
        self,
        name: str,
        deadline: datetime | None = None,
        *,
        action: str = "stop",
        actor: str = "",
    ) -> dict[str, Any]:
        """Drain a node: nothing new lands there; with a ``deadline``, every live lease on it
        gets a ``drain`` notice ending then (a grant not yet bound is released now). Decided
        by ``pool.decide`` (one rule: ``SetNode``'s flags, ``admin_notice``'s notices)."""
        with self.transaction() as (db, alloc):
            row = orm.NodeRow.find(db, name)
            rows: list[orm.LeaseRow] = []
            if row is not None and deadline is not None:
                rows = list(
                    db.scalars(
                        select(orm.LeaseRow)
                        .where(orm.LeaseRow.node == name, orm.LeaseRow.state.in_(LIVE_STATES))
                        .options(selectinload(orm.LeaseRow.slots))
                        .order_by(orm.LeaseRow.granted, orm.LeaseRow.id)
                    ).all()
                )
            # a grant is released: its pending targets go along (their facts are read too)
            granted = [r for r in rows if r.state == "granted" and r.reclaim_acting is None]
            facts, held = self._lease_facts(db, alloc, granted)
            on_node = tuple((facts.get(r.id) or lease_facts(r), reclaim_state(r)) for r in rows)
            state = PoolState(alloc, facts, node_known=row is not None, on_node=on_node)
            command = c.DrainNode(name, deadline, action)
            outcome = decided(state, command, self._now_s())
            known = {**{r.id: r for r in rows}, **held}
            self._apply_effects(db, alloc, outcome.effects, actor, known)
            assert row is not None  # else refused
            noticed, released = outcome.answer
            out = node_json(row)
            return {**out, "deadline": ts(deadline), "noticed": noticed, "released": released}

    # -- MIG re-partition ------------------------------------------------------------------

    def _gpu_row(self, db: Session, node: str, gpu: str) -> orm.GpuRow:
        row = db.scalar(
            select(orm.GpuRow)
            .join(orm.NodeRow)
            .where(orm.NodeRow.name == node, orm.GpuRow.uuid == gpu)
            .options(selectinload(orm.GpuRow.instances))
        )
        if row is None:
            raise StoreError("not_found", f"no GPU {gpu!r} on node {node!r}", field="gpu")
        return row

    def _held(self, db: Session, g: orm.GpuRow) -> list[Held]:
        """What the GPU holds now: its instances (with their holders) and whole or shared
        slots."""
        slots = db.scalars(
            select(orm.LeaseSlotRow)
            .where(orm.LeaseSlotRow.gpu_uuid == g.uuid, orm.LeaseSlotRow.live)
            .options(selectinload(orm.LeaseSlotRow.lease))
        ).all()
        by_key = {(s.profile, s.start): s for s in slots if s.kind == "mig"}
        out = []
        seen = set()
        for i in sorted(g.instances, key=lambda i: i.start):
            s = by_key.get((i.profile, i.start))
            seen.add((i.profile, i.start))
            out.append(
                Held(i.profile, i.start, s.lease_id if s else None, s.lease.user if s else None)
            )
        for (profile, start), s in by_key.items():
            if (profile, start) not in seen:
                out.append(Held(profile, start, s.lease_id, s.lease.user))
        out += [Held(None, None, s.lease_id, s.lease.user) for s in slots if s.kind != "mig"]
        return out

    def _plan(self, db: Session, g: orm.GpuRow, layout: Iterable[tuple[str, int]]) -> Any:
        model = self.catalog.model_for_nvml(g.model, g.memory_mib)
        return plan_repartition(g.uuid, model, g.mig_enabled, self._held(db, g), layout)

    @staticmethod
    def _method(g: orm.GpuRow) -> str:
        """How the node gets the layout (``pool.repartition.delivery``)."""
        return delivery(g.dynamic_mig, g.mig_enabled)

    def repartition_plan(self, node: str, gpu: str, layout: object) -> dict[str, Any]:
        """The plan of a re-partition, without running it (the panel's preview)."""
        target = parse_layout(layout)
        with self.read() as db:
            g = self._gpu_row(db, node, gpu)
            return {**self._plan(db, g, target).to_json(), "method": self._method(g)}

    def _find_gpu(self, db: Session, node: str, gpu: str) -> orm.GpuRow | None:
        try:
            return self._gpu_row(db, node, gpu)
        except StoreError:
            return None

    def _repartitions(
        self, db: Session, alloc: Allocator, reps: Iterable[orm.MigRepartitionRow]
    ) -> tuple[tuple[Repartition, MigGpu | None], ...]:
        """The re-partitions' facts, each with its GPU's (None: gone)."""
        out = []
        for rep in reps:
            g = self._find_gpu(db, rep.node, rep.gpu_uuid)
            layout = tuple((i["profile"], i["start"]) for i in rep.layout)
            facts = Repartition(
                rep.id, rep.node, rep.gpu_uuid, layout, rep.method, rep.state, rep.was_cordoned
            )
            out.append((facts, None if g is None else self._mig_gpu(g, self._held(db, g))))
        return tuple(out)

    def request_repartition(
        self,
        node: str,
        gpu: str,
        layout: object,
        *,
        notice_seconds: float | None = None,
        actor: str = "",
    ) -> dict[str, Any]:
        """Ask for ``layout`` on a GPU: it is cordoned and waits until nothing holds what must
        go (with ``notice_seconds``, the leases in the way get admin notices ending then).
        Decided by ``pool.decide`` (``pool.rules.mig``)."""
        with self.transaction() as (db, alloc):
            g = self._find_gpu(db, node, gpu)
            mig_gpu = self._mig_gpu(g, self._held(db, g)) if g is not None else None
            open_ = None
            if g is not None:
                row = db.scalar(
                    select(orm.MigRepartitionRow).where(
                        orm.MigRepartitionRow.gpu_uuid == gpu,
                        orm.MigRepartitionRow.state.in_(OPEN),
                    )
                )
                open_ = None if row is None else self._repartitions(db, alloc, [row])[0][0]
            holders = [] if mig_gpu is None else sorted({h.lease for h in mig_gpu.held if h.lease})
            rows = [self.lease_row(db, lid) for lid in holders]
            # a grant is released: its pending targets go along (their facts are read too)
            facts, known = self._lease_facts(db, alloc, [r for r in rows if r.state == "granted"])
            on_node = tuple((facts.get(r.id) or lease_facts(r), reclaim_state(r)) for r in rows)
            state = PoolState(
                alloc, facts, mig_gpu=mig_gpu, open_repartition=open_, on_node=on_node
            )
            command = c.RequestRepartition(node, gpu, layout, notice_seconds)
            outcome = decided(state, command, self._now_s())
            known |= {r.id: r for r in rows}
            self._apply_effects(db, alloc, outcome.effects, actor, known)
            assert g is not None  # else refused
            rep = self.repartition_row(db, 0, gpu)
            return self._repartition_json(db, rep, g)

    def cancel_repartition(self, rep_id: int, *, actor: str = "") -> dict[str, Any]:
        """Give up a re-partition still waiting (one being applied is the node's now;
        ``pool.decide``)."""
        with self.transaction() as (db, alloc):
            rep = db.get(orm.MigRepartitionRow, rep_id)
            reps = () if rep is None else self._repartitions(db, alloc, [rep])
            state = PoolState(alloc, repartitions=reps)
            outcome = decided(state, c.CancelRepartition(rep_id), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
            assert rep is not None  # else refused
            return self._repartition_json(db, rep, self._find_gpu(db, rep.node, rep.gpu_uuid))

    def advance_repartitions(self) -> int:
        """Run the waiting re-partitions nothing is in the way of any more, and close those
        the nodes finished (or failed); returns how many changed (``pool.decide``)."""
        with self.read() as db:
            if (
                db.scalar(
                    select(orm.MigRepartitionRow.id).where(orm.MigRepartitionRow.state.in_(OPEN))
                )
                is None
            ):
                return 0
        with self.transaction() as (db, alloc):
            open_ = db.scalars(
                select(orm.MigRepartitionRow).where(orm.MigRepartitionRow.state.in_(OPEN))
            ).all()
            state = PoolState(
                alloc,
                repartitions=self._repartitions(db, alloc, open_),
                mig_attempts=self.mig_attempts,
            )
            outcome = decided(state, c.AdvanceRepartitions(), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, "system")
            return int(outcome.answer)

    def _repartition_json(
        self, db: Session, rep: orm.MigRepartitionRow, g: orm.GpuRow | None
    ) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": rep.id,
            "node": rep.node,
            "gpu": rep.gpu_uuid,
            "layout": rep.layout,
            "method": rep.method,
            "state": rep.state,
            "actor": rep.actor,
            "created": ts(rep.created),
            "updated": ts(rep.updated),
            "error": rep.error,
            "plan": None,
        }
        if g is not None and rep.state in OPEN:
            target = [(i["profile"], i["start"]) for i in rep.layout]
            out["plan"] = self._plan(db, g, target).to_json()
        return out

    def repartitions(
        self, node: str | None = None, state: str | None = None, limit: int = 200
    ) -> list[dict[str, Any]]:
        """Re-partitions, newest first (a label writer asks for ``state=applying``)."""
        if state is not None and state not in orm.REPARTITION_STATES:
            raise StoreError(
                "invalid_state",
                f"unknown re-partition state {state!r}",
                field="state",
                allowed=orm.REPARTITION_STATES,
            )
        with self.read() as db:
            q = select(orm.MigRepartitionRow)
            if node is not None:
                q = q.where(orm.MigRepartitionRow.node == node)
            if state is not None:
                q = q.where(orm.MigRepartitionRow.state == state)
            rows = db.scalars(q.order_by(orm.MigRepartitionRow.id.desc()).limit(limit)).all()
            out = []
            for rep in rows:
                g = None
                if rep.state in OPEN:
                    try:
                        g = self._gpu_row(db, rep.node, rep.gpu_uuid)
                    except StoreError:
                        g = None
                out.append(self._repartition_json(db, rep, g))
            return out

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

from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.ending import admin_notice
from ..pool.errors import Refusal
from ..pool.facts import MigGpu, PoolState, Repartition
from ..pool.leases import LIVE_STATES
from ..pool.noticefacts import Noticed
from ..pool.reclaim import Reclaiming
from ..pool.repartition import Held, Plan, delivery, parse_layout, plan_repartition
from ..pool.rules.notices import (
    check_admin_reclaim,
    check_overdue,
    check_seconds,
    unclaimed,
)
from .admin import AdminStore
from .apply import decided, lease_facts
from .errors import StoreError
from .panel import OPEN, PanelViews
from .read.leases import LeaseView
from .read.nodes import NodeDrainView, node_view
from .read.reclaim import EnforcedNoticeView, enforced_notice_view
from .read.repartitions import (
    RepartitionPlanView,
    RepartitionView,
    layout_of,
    repartition_view,
)
from .reclaim import ReclaimStore, noticed
from .rows import (
    epoch,
    reclaim_state,
)

#: Notices the pool service carries out itself once overdue (an idle notice needs the
#: reclaimer, which asks the lab to save everything first).
ENFORCED_KINDS = ("admin", "drain", "exception", "budget")


def _checked(check: Callable[..., None], *args: Any) -> None:
    """A command's own check, before any lease is looked up (as the API answers)."""
    try:
        check(*args)
    except Refusal as e:
        raise StoreError.of(e) from None


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

    def _notice_command(
        self, db: Session, alloc: Allocator, lease_id: str, command: c.Command, actor: str
    ) -> LeaseView:
        """An administrator's command on one lease's notice (``pool.decide``): the lease with
        its pending targets and its offer's policy read first; the lease after."""
        row = self.lease_row(db, lease_id)
        facts, rows = self._lease_facts(db, alloc, [row])
        policy = self.reclaim_policies(db, alloc.offers).for_offer(
            alloc.offers.get(row.offer) or row.offer
        )
        state = PoolState(
            alloc, facts, noticed=(noticed(row, facts[row.id]),), policy=policy, actor=actor
        )
        outcome = decided(state, command, self._now_s())
        self._apply_effects(db, alloc, outcome.effects, actor, rows)
        return self._lease_view(db, alloc, row)

    def admin_reclaim(
        self,
        lease_id: str,
        *,
        immediately: bool = False,
        grace: float | None = None,
        action: str = "stop",
        reason: str = "",
        actor: str = "",
    ) -> LeaseView:
        """Reclaim a live lease: a notice ending in ``grace`` seconds (default: the offer's
        ``warn_before``), or (``immediately``) a release now with reason ``admin``
        (``pool.decide``)."""
        _checked(check_admin_reclaim, action, grace)
        command = c.AdminReclaim(lease_id, immediately, grace, action, reason)
        with self.transaction() as (db, alloc):
            return self._notice_command(db, alloc, lease_id, command, actor)

    def extend_notice(self, lease_id: str, seconds: float, *, actor: str = "") -> LeaseView:
        """Push a reclaim notice's deadline ``seconds`` later (from now, if it has passed;
        ``pool.decide``)."""
        _checked(check_seconds, seconds)
        with self.transaction() as (db, alloc):
            command = c.ExtendNotice(lease_id, seconds)
            return self._notice_command(db, alloc, lease_id, command, actor)

    # -- cancel a notice ---------------------------------------------------------------------

    def cancel_notice(self, lease_id: str, reason: str = "", *, actor: str = "") -> LeaseView:
        """An admin withdraws a lease's reclaim notice, whatever its kind (``no_notice`` when
        there is none; ``reclaim_in_progress`` once a round or the service claimed the
        action: too late; ``pool.decide``)."""
        with self.transaction() as (db, alloc):
            command = c.CancelNotice(lease_id, reason)
            return self._notice_command(db, alloc, lease_id, command, actor)

    # -- overdue notices, carried out by the service ---------------------------------------

    def _overdue(self, db: Session, overdue: float) -> tuple[list[orm.LeaseRow], list[Noticed]]:
        """Live leases under an enforced notice whose deadline passed more than ``overdue``
        seconds ago, and what the rules read of each (``pool.rules.notices.unclaimed`` keeps
        those no one carries out). Not a job's lease: no hub server to stop; its runner stops
        the job (``store/jobs.py``)."""
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
        return list(rows), [noticed(r) for r in rows]

    def enforce_notices(self, overdue: float, *, actor: str = "") -> list[EnforcedNoticeView]:
        """Claim every admin or drain notice overdue by more than ``overdue`` seconds that no
        reclaimer acts on, for the caller to stop its server (then ``notice_enforced``;
        ``pool.decide``).

        Claimed as a reclaim round claims an action (``reclaim_acting``, release reason
        ``admin``): a reclaimer's round and the user's keepalive then leave it alone, and the
        server's own stop releases it with that reason. Nothing overdue: nothing is written
        (the pool version stays, so the cached map and other replicas' allocators too).
        """
        _checked(check_overdue, overdue)
        with self.read() as db:
            _, found = self._overdue(db, overdue)
            if not unclaimed(found, self._now_s(), self.reclaim_claim_timeout):
                return []
        with self.transaction() as (db, alloc):
            rows, found = self._overdue(db, overdue)
            state = PoolState(alloc, noticed=tuple(found), claim_timeout=self.reclaim_claim_timeout)
            outcome = decided(state, c.EnforceNotices(overdue), self._now_s())
            self._apply_effects(
                db, alloc, outcome.effects, actor or "system", {r.id: r for r in rows}
            )
            return [enforced_notice_view(claimed) for claimed in outcome.answer]

    def notice_enforced(
        self, lease_id: str, stopped: bool, detail: str = "", *, actor: str = ""
    ) -> LeaseView:
        """The service stopped the server of a notice it claimed (``stopped``): the lease is
        released (reason ``admin``, if the server's stop has not released it already). Not
        stopped (the hub refused, or it did not stop in time): the claim stays, so the notice
        is tried again once the claim is older than ``reclaim_claim_timeout``
        (``pool.decide``)."""
        with self.transaction() as (db, alloc):
            row = self.lease_row(db, lease_id)
            command = c.NoticeEnforced(lease_id, stopped, detail)
            return self._claim_ends(db, alloc, row, command, actor)

    # -- drain by a deadline ---------------------------------------------------------------

    def drain_node(
        self,
        name: str,
        deadline: datetime | None = None,
        *,
        action: str = "stop",
        actor: str = "",
    ) -> NodeDrainView:
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
            return NodeDrainView(node_view(row), deadline, noticed, released)

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

    def _plan(self, db: Session, g: orm.GpuRow, layout: Iterable[tuple[str, int]]) -> Plan:
        model = self.catalog.model_for_nvml(g.model, g.memory_mib)
        return plan_repartition(g.uuid, model, g.mig_enabled, self._held(db, g), layout)

    @staticmethod
    def _method(g: orm.GpuRow) -> str:
        """How the node gets the layout (``pool.repartition.delivery``)."""
        return delivery(g.dynamic_mig, g.mig_enabled)

    def repartition_plan(self, node: str, gpu: str, layout: object) -> RepartitionPlanView:
        """The plan of a re-partition, without running it (the panel's preview)."""
        target = parse_layout(layout)
        with self.read() as db:
            g = self._gpu_row(db, node, gpu)
            return RepartitionPlanView(self._plan(db, g, target), self._method(g))

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
    ) -> RepartitionView:
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
            return self._repartition_view(db, rep, g)

    def cancel_repartition(self, rep_id: int, *, actor: str = "") -> RepartitionView:
        """Give up a re-partition still waiting (one being applied is the node's now;
        ``pool.decide``)."""
        with self.transaction() as (db, alloc):
            rep = db.get(orm.MigRepartitionRow, rep_id)
            reps = () if rep is None else self._repartitions(db, alloc, [rep])
            state = PoolState(alloc, repartitions=reps)
            outcome = decided(state, c.CancelRepartition(rep_id), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
            assert rep is not None  # else refused
            return self._repartition_view(db, rep, self._find_gpu(db, rep.node, rep.gpu_uuid))

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

    def _repartition_view(
        self, db: Session, rep: orm.MigRepartitionRow, g: orm.GpuRow | None
    ) -> RepartitionView:
        """``read.repartitions.repartition_view`` of ``rep``, planned against ``g``'s holders
        while it is open."""
        plan = None
        if g is not None and rep.state in OPEN:
            plan = self._plan(db, g, [(i.profile, i.start) for i in layout_of(rep)])
        return repartition_view(rep, plan)

    def repartitions(
        self, node: str | None = None, state: str | None = None, limit: int = 200
    ) -> list[RepartitionView]:
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
                out.append(self._repartition_view(db, rep, g))
            return out

"""Idle-GPU reclamation in the pool: the reclaimer's leader lock, its rounds (decided by
``pool.decide``, ``pool.rules.reclaim`` over the pure rules of ``pool.reclaim``, and applied to
the rows in one transaction), the outcome of an action, the user's "keep my GPU", the admin's
policy override and the user's recent reclaims.

The pool decides, the reclaimer sees and acts: a round gets what the reclaimer saw of each
lease's server and user, adds the window's GPU samples stored in the database (every
replica's: ``utilization_samples``, so any replica decides alike), and ``pool.decide`` plans
with every lease's persisted ``ReclaimState``; the one applier writes each decision back. An
``Act`` is *claimed* in the same transaction (``reclaim_acting``), and keepalive runs through
the same writer, so one of them wins and the audit log says which.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.errors import PoolError, Refusal
from ..pool.facts import LeaseFacts, PoolState
from ..pool.idlesignal import lab_presence
from ..pool.kernels import KERNEL_HOLDER
from ..pool.noticefacts import Noticed, Shrinkable
from ..pool.reclaim import (
    GpuSample,
    KernelView,
    PresenceView,
    Signals,
    gpu_signal_source,
)
from ..pool.rules.reclaim import check_result
from ..pool.workloads import idle_reclaimable
from ..timeparse import format_time
from .apply import TARGET_STATES, decided, lease_facts
from .errors import StoreError
from .presence import PresenceStore
from .read.leases import LeaseView, WatchedLeaseView, watched_lease_view
from .read.reclaim import (
    LeaderView,
    PastReclaimView,
    ReclaimMinute,
    ReclaimPolicyView,
    ReclaimRoundView,
    WithdrawnNoticeView,
    decision_view,
    past_reclaim_view,
    reclaim_policy_view,
    round_view,
    withdrawn_notice_view,
)
from .read.users import UserView, user_notices
from .read.utilization import MinuteView
from .rows import (
    aware,
    epoch,
    lease_info,
    reclaim_state,
    upsert_insert,
)
from .utilization import Device, UtilizationStore, window_samples
from .views import EVERY_HUB, EveryHub

#: What the reclaimer saw of one lease: its server's kernels and its user (either may be None).
Observation = tuple[KernelView | None, PresenceView | None]
#: States the reclaimer looks at: bound leases (a grant not bound yet is not idle, it starts).
WATCHED = ("active", "reclaiming")
#: Audit kinds of a finished reclaim (the user page's history).
FINISHED = ("reclaimed", "reclaim-failed")
#: Lease-ttl bounds of the leader lock (seconds).
LEADER_TTL = (5.0, 600.0)


def _devices(row: orm.LeaseRow) -> list[Device]:
    return [(s.gpu_uuid, s.start if s.kind == "mig" else None) for s in row.slots if s.live]


class ReclaimStore(PresenceStore, UtilizationStore):
    """The pool's side of idle-GPU reclamation (``reclaim_stale_after`` and
    ``reclaim_claim_timeout`` are ``StoreCore`` settings)."""

    # -- the leader lock ---------------------------------------------------------------------

    def _leader_row(self, db: Session) -> orm.ReclaimLeaderRow:
        """The one leader row, made if missing, locked to the end of the transaction."""
        db.execute(upsert_insert(db, orm.ReclaimLeaderRow).values(id=1).on_conflict_do_nothing())
        stmt = select(orm.ReclaimLeaderRow).where(orm.ReclaimLeaderRow.id == 1)
        if db.get_bind().dialect.name == "postgresql":
            stmt = stmt.with_for_update()
        return db.scalars(stmt.execution_options(populate_existing=True)).one()

    def _check_leader(self, db: Session, holder: str) -> None:
        row = self._leader_row(db)
        if row.holder != holder or row.expires is None or row.expires <= self.clock():
            who = (
                f"{row.holder} leads until {format_time(row.expires)}"
                if row.holder and row.expires and row.expires > self.clock()
                else "nobody leads; take the lead first"
            )
            raise StoreError(
                "not_leader", f"{holder!r} is not the reclaim leader: {who}", field="holder"
            )

    def take_leader(self, holder: str, ttl: float = 60.0, *, actor: str = "") -> LeaderView:
        """Lead the reclaimer replicas for ``ttl`` seconds (the holder renews the same way);
        ``not_leader`` while another holder's lease runs."""
        if not holder:
            raise StoreError("invalid_field", "holder must not be empty", field="holder")
        if not LEADER_TTL[0] <= ttl <= LEADER_TTL[1]:
            raise StoreError(
                "invalid_field",
                f"ttl must be between {LEADER_TTL[0]:g} and {LEADER_TTL[1]:g} seconds",
                field="ttl",
            )
        now = self.clock()
        with self.writing() as db:
            row = self._leader_row(db)
            if row.holder not in (None, holder) and row.expires is not None and row.expires > now:
                raise StoreError(
                    "not_leader",
                    f"{row.holder} leads the reclaimer until {format_time(row.expires)}",
                    field="holder",
                )
            if row.holder != holder:
                self._event(db, "reclaim-leader", actor, data={"holder": holder, "was": row.holder})
            row.holder, row.expires = holder, now + timedelta(seconds=ttl)
            return LeaderView(holder, row.expires, True)

    def give_up_leader(self, holder: str, *, actor: str = "") -> LeaderView:
        """``holder`` stops leading (another replica may take over at once); a holder that
        does not lead changes nothing."""
        with self.writing() as db:
            row = self._leader_row(db)
            if row.holder == holder:
                row.holder, row.expires = None, None
                self._event(db, "reclaim-leader", actor, data={"holder": None, "was": holder})
            live = row.expires is not None and row.expires > self.clock()
            return LeaderView(row.holder if live else None, row.expires if live else None, False)

    # -- reads for the reclaimer -------------------------------------------------------------

    def _watched(self) -> ColumnElement[bool]:
        """The leases the reclaimer watches: bound, of a class it may reclaim when idle (a
        training job is preempted through its job's notice instead, ``store/jobs.py``; a GPU
        kernel is shut down by the kernel reaper, ``store/kernels.py``)."""
        classes = self.file_config.classes
        never = [name for name in classes if not idle_reclaimable(classes, name)]
        return and_(
            orm.LeaseRow.state.in_(WATCHED),
            or_(orm.LeaseRow.workload.is_(None), orm.LeaseRow.workload.not_in(never)),
            # a GPU kernel's idleness is the kernel reaper's (store/kernels.py)
            or_(orm.LeaseRow.holder.is_(None), orm.LeaseRow.holder != KERNEL_HOLDER),
        )

    def reclaim_leases(
        self, offset: int = 0, limit: int = 200
    ) -> tuple[list[WatchedLeaseView], int]:
        """Live leases the reclaimer watches (``active``, ``reclaiming``), oldest grant first."""
        with self.locked() as alloc, self.read() as db:
            q = select(orm.LeaseRow).where(self._watched())
            total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
            rows = db.scalars(
                q.order_by(orm.LeaseRow.granted, orm.LeaseRow.id).offset(offset).limit(limit)
            ).all()
            return [
                watched_lease_view(r, self._reclaim_view(db, alloc, r) if r.reclaim_kind else None)
                for r in rows
            ], total

    def reclaim_devices(self) -> dict[str, list[Device]]:
        """The devices of every watched lease: whose samples a round needs."""
        with self.read() as db:
            rows = db.scalars(
                select(orm.LeaseRow)
                .where(self._watched())
                .options(selectinload(orm.LeaseRow.slots))
            )
            return {r.id: _devices(r) for r in rows}

    def reclaiming_count(self) -> int:
        """Leases under a reclaim notice now (the metrics gauge)."""
        with self.read() as db:
            return (
                db.scalar(
                    select(func.count())
                    .select_from(orm.LeaseRow)
                    .where(orm.LeaseRow.state == "reclaiming")
                )
                or 0
            )

    # -- a round -----------------------------------------------------------------------------

    def _signals(
        self,
        alloc: Allocator,
        row: orm.LeaseRow,
        window: tuple[float, float],
        seen: Observation | None,
        samples: Mapping[Device, Sequence[GpuSample]],
    ) -> Signals:
        """What is known of the lease over ``window``: its devices' samples in it, and what
        the reclaimer saw (nothing seen: stale, so nothing moves)."""
        start, end = window
        gpu = tuple(
            sorted(
                (s for d in _devices(row) for s in samples.get(d, ()) if start <= s.ts <= end),
                key=lambda s: s.ts,
            )
        )
        offer = alloc.offers.get(row.offer)
        source = "utilization"
        if offer is not None and offer.kind == "mig":
            try:
                source = gpu_signal_source(offer, self.catalog.model(row.model or ""))
            except PoolError:
                source = "memory"
        kernel, presence = seen if seen is not None else (None, None)
        if row.presence_source is not None:  # the lab reports input: only that is presence
            presence = lab_presence(
                presence, epoch(row.last_input) if row.last_input is not None else None
            )
        return Signals(start, end, source, gpu, kernel, presence)

    def reclaim_round(
        self,
        holder: str,
        window: tuple[float, float],
        observed: Mapping[str, Observation],
        samples: Mapping[Device, Sequence[GpuSample]] | None = None,
        *,
        actor: str = "",
    ) -> ReclaimRoundView:
        """One window of every watched lease, decided and applied in one transaction.

        ``observed``: lease id → (kernels, presence) as the reclaimer saw them; ``samples``:
        the GPU samples by device, or None (the service): the window's samples stored in
        ``utilization_samples``, read in this transaction, whichever replica took them.
        Returns the pool's clock and one decision each.
        """
        start, end = window
        if end <= start:
            raise StoreError(
                "invalid_field", "window.end must be after window.start", field="window"
            )
        with self.transaction() as (db, alloc):
            self._check_leader(db, holder)
            now = self._now_s()
            rows = db.scalars(
                select(orm.LeaseRow)
                .where(self._watched())
                .options(selectinload(orm.LeaseRow.slots))
                .order_by(orm.LeaseRow.granted, orm.LeaseRow.id)
            ).all()
            free = [r for r in rows if r.reclaim_acting is None]
            claimed = [r for r in rows if r.reclaim_acting is not None]
            policies = self.reclaim_policies(db, alloc.offers)
            if samples is None:
                samples = window_samples(db, {d for r in free for d in _devices(r)}, start, end)
            facts, shrinks = self._shrinkable(db, free)
            state = PoolState(
                alloc,
                facts,
                watched=tuple(lease_info(r) for r in free),
                signals={
                    r.id: self._signals(alloc, r, window, observed.get(r.id), samples) for r in free
                },
                policies=policies,
                claimed=tuple(noticed(r) for r in claimed),
                stale_after=self.reclaim_stale_after,
                claim_timeout=self.reclaim_claim_timeout,
                shrinks=shrinks,
                clusters=tuple(self.file_config.clusters),
            )
            command = c.ReclaimRound(holder, window, observed, samples)
            outcome = decided(state, command, now)
            by_id = {r.id: r for r in rows}
            self._apply_effects(db, alloc, outcome.effects, actor or "system", by_id)
            return round_view(
                now,
                (
                    decision_view(by_id[said.lease], self._offer_name(by_id[said.lease]), said)
                    for said in outcome.answer
                ),
            )

    def _shrinkable(
        self, db: Session, rows: Sequence[orm.LeaseRow]
    ) -> tuple[dict[str, LeaseFacts], dict[str, Shrinkable]]:
        """What the shrink of each of ``rows`` under a shrink's notice reads, should the
        round act on it (its target asked as ``commands.Resize`` asks it): its facts and its
        original's (a bound resize target's), the id its target would get, and the live
        target it already has. An action is its notice's, so no other lease shrinks."""
        may = [r for r in rows if (r.reclaim_action or "").startswith("shrink:")]
        if not may:
            return {}, {}
        pending: dict[str, str] = {}
        for lid, of in db.execute(
            select(orm.LeaseRow.id, orm.LeaseRow.resize_of).where(
                orm.LeaseRow.resize_of.in_([r.id for r in may]),
                orm.LeaseRow.state.in_(TARGET_STATES),
            )
        ):
            if of is not None:
                pending.setdefault(of, lid)
        facts = {r.id: lease_facts(r) for r in may}
        for r in may:
            original = db.get(orm.LeaseRow, r.resize_of) if r.resize_of else None
            if original is not None:
                facts.setdefault(original.id, lease_facts(original))
        return facts, {r.id: Shrinkable(uuid.uuid4().hex, pending.get(r.id)) for r in may}

    def _offer_name(self, row: orm.LeaseRow) -> str:
        """What people read of the lease's offer (the notify hook's messages): its display
        name, not its id."""
        offer = self._allocator.offers.get(row.offer) if self._allocator is not None else None
        return (offer.display_name if offer is not None else "") or row.offer

    # -- the outcome of an action ------------------------------------------------------------

    def reclaim_outcome(
        self,
        lease_id: str,
        holder: str,
        result: str,
        saved: Iterable[str] = (),
        detail: str = "",
        *,
        actor: str = "",
    ) -> LeaseView:
        """The reclaimer carried out (``done``) or could not carry out (``failed``) a claimed
        action: the lease is released with its claimed reason, or goes back to its user
        (``pool.decide``)."""
        try:
            check_result(result)
        except Refusal as e:
            raise StoreError.of(e) from None
        command = c.ReclaimOutcome(lease_id, holder, result, tuple(str(p) for p in saved), detail)
        with self.transaction() as (db, alloc):
            self._check_leader(db, holder)
            row = self.lease_row(db, lease_id)
            return self._claim_ends(db, alloc, row, command, actor)

    def _claim_ends(
        self,
        db: Session,
        alloc: Allocator,
        row: orm.LeaseRow,
        command: c.ReclaimOutcome | c.NoticeEnforced,
        actor: str,
    ) -> LeaseView:
        """A claimed reclaim's outcome (the reclaimer's or the service's), decided and
        applied; the lease after."""
        target = db.get(orm.LeaseRow, row.reclaim_target) if row.reclaim_target else None
        facts, read = self._lease_facts(db, alloc, [row] if target is None else [row, target])
        state = PoolState(alloc, facts, noticed=(noticed(row, facts[row.id]),))
        outcome = decided(state, command, self._now_s())
        self._apply_effects(db, alloc, outcome.effects, actor or "system", read)
        return self._lease_view(db, alloc, row)

    # -- the admin's policies ----------------------------------------------------------------

    def reclaim_policy(self) -> ReclaimPolicyView:
        """The ``reclaim`` section in effect, where it comes from, and each offer's resolved
        policy."""
        with self.locked() as alloc, self.read() as db:
            section, source = self.reclaim_section(db)
            policies = self.reclaim_policies(db, alloc.offers)
            return reclaim_policy_view(section, source, policies, alloc.offers)

    def put_reclaim_policy(
        self, section: Mapping[str, Any], *, actor: str = ""
    ) -> ReclaimPolicyView:
        """Replace the ``reclaim`` section (validated against today's offers; an error names
        ``reclaim.<level>.<field>``); it wins over the pool config file until deleted."""
        with self.transaction() as (db, alloc):
            state = PoolState(alloc, catalog=self.catalog)
            outcome = decided(state, c.PutReclaimPolicy(section), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
        return self.reclaim_policy()

    def reset_reclaim_policy(self, *, actor: str = "") -> ReclaimPolicyView:
        """Drop the admin's override: the pool config file's section (or the defaults) apply."""
        with self.transaction() as (db, alloc):
            state = PoolState(alloc, policy_override=db.get(orm.ReclaimPolicyRow, 1) is not None)
            outcome = decided(state, c.ResetReclaimPolicy(), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor)
        return self.reclaim_policy()

    # -- the user's page ---------------------------------------------------------------------

    def user(
        self, name: str, groups: Iterable[str] = (), hub: str | EveryHub | None = EVERY_HUB
    ) -> UserView:
        """A user's quota, use, leases and notices (the leases of ``hub`` only, when given:
        quota and use are the user's across the hubs), and the user's recent reclaims and
        withdrawn notices."""
        with self.locked() as alloc:
            leases, _ = self.leases(user=name, limit=100, hub=hub)
            live = tuple(le for le in leases if le.state != "released")
            spec = alloc.quotas.user_spec(name)
            held = float(alloc.quotas.held(name))
            # a budget applies: what is used (0 when nothing is); none applies: None
            used = None if spec.budget is None else alloc.quotas.used_hours.get(name, 0.0)
        return UserView(
            name=name,
            groups=tuple(groups),
            quota=spec,
            held_units=held,
            used_unit_hours=used,
            leases=live,
            notices=user_notices(live),
            reclaims=tuple(self.recent_reclaims(name)),
            withdrawn=tuple(self.withdrawn_notices(name)),
        )

    def withdrawn_notices(
        self, user: str, hours: float = 24.0, limit: int = 5
    ) -> list[WithdrawnNoticeView]:
        """The user's notices an administrator withdrew (a cancel, an uncordon) in the last
        ``hours``, newest first: which lease, what kind of notice, when and why."""
        since = self.clock() - timedelta(hours=hours)
        with self.read() as db:
            events = db.scalars(
                select(orm.EventRow)
                .where(
                    orm.EventRow.user == user,
                    orm.EventRow.kind == "reclaim-cancelled",
                    orm.EventRow.ts >= since,
                )
                .order_by(orm.EventRow.ts.desc(), orm.EventRow.id.desc())
                .limit(50)
            ).all()
            out = []
            for e in events:
                if not (e.data or {}).get("by_admin"):
                    continue
                row = db.get(orm.LeaseRow, e.lease_id) if e.lease_id else None
                out.append(withdrawn_notice_view(e, row))
        return out[:limit]

    def recent_reclaims(
        self, user: str, days: float = 7.0, limit: int = 20
    ) -> list[PastReclaimView]:
        """The user's reclaims of the last ``days``, newest first: what, when, why, the files
        saved, and each lease's minute utilization over its last hour."""
        since = self.clock() - timedelta(days=days)
        with self.read() as db:
            events = db.scalars(
                select(orm.EventRow)
                .where(
                    orm.EventRow.user == user,
                    orm.EventRow.kind.in_(FINISHED),
                    orm.EventRow.ts >= since,
                )
                .order_by(orm.EventRow.ts.desc(), orm.EventRow.id.desc())
                .limit(limit)
            ).all()
            ids = {e.lease_id for e in events if e.lease_id}
            rows = {
                r.id: r
                for r in db.scalars(
                    select(orm.LeaseRow)
                    .where(orm.LeaseRow.id.in_(ids))
                    .options(selectinload(orm.LeaseRow.slots))
                )
            }
        out = []
        for e in events:
            row = rows.get(e.lease_id or "")
            out.append(past_reclaim_view(e, row, self._last_hour(row, e) if row else ()))
        return out

    def _last_hour(self, row: orm.LeaseRow, event: orm.EventRow) -> list[ReclaimMinute]:
        """The lease's minutes over the hour before it ended (or before the event), one entry
        per minute (the mean over its devices, the most memory any held)."""
        end = row.released or event.ts
        start = (end - timedelta(hours=1)).replace(second=0, microsecond=0)
        if row.granted is not None:
            start = max(start, row.granted.replace(second=0, microsecond=0))
        devices = [(s.gpu_uuid, s.start if s.kind == "mig" else None) for s in row.slots]
        if not devices:
            return []
        merged: dict[datetime, list[MinuteView]] = {}
        for m in self.minutes(devices, start, end):
            merged.setdefault(m.minute, []).append(m)
        out = []
        for minute, ms in sorted(merged.items()):
            utils = [m.util_mean for m in ms if m.util_mean is not None]
            out.append(
                ReclaimMinute(
                    minute,
                    sum(utils) / len(utils) if utils else None,
                    max(m.memory_used_mib_max for m in ms),
                )
            )
        return out


def noticed(row: orm.LeaseRow, facts: LeaseFacts | None = None) -> Noticed:
    """What the notice rules read of a lease's row (``pool.noticefacts.Noticed``; ``facts``:
    its facts with its pending targets, when the rule may end it)."""
    return Noticed(
        facts or lease_facts(row),
        reclaim_state(row),
        row.reclaim_action,
        row.reclaim_reason,
        aware(row.reclaim_deadline),
        None if row.reclaim_acting is None else epoch(row.reclaim_acting),
        aware(row.reclaim_acting),
    )

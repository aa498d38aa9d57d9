"""Idle-GPU reclamation in the pool: the reclaimer's leader lock, its rounds (the pure rules of
``pool.reclaim`` applied to the rows in one transaction), the outcome of an action, the user's
"keep my GPU", the admin's policy override and the user's recent reclaims.

The pool decides, the reclaimer sees and acts: a round gets what the reclaimer saw of each
lease's server and user, adds the window's GPU samples stored in the database (every
replica's: ``utilization_samples``, so any replica decides alike), plans with every lease's
persisted ``ReclaimState`` and writes each decision back. An ``Act`` is *claimed* in the same
transaction (``reclaim_acting``), and keepalive runs through the same writer, so one of them
wins and the audit log says which.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict
from datetime import timedelta
from typing import Any

from sqlalchemy import ColumnElement, and_, func, or_, select
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool.allocator import Allocator
from ..pool.errors import ConfigError, PoolError
from ..pool.idlesignal import lab_presence
from ..pool.kernels import KERNEL_HOLDER
from ..pool.leases import LIVE_STATES
from ..pool.reclaim import (
    Act,
    Cancel,
    Decision,
    GpuSample,
    KernelView,
    NoAction,
    Notice,
    PresenceView,
    ReclaimPolicy,
    ReclaimState,
    Signals,
    gpu_signal_source,
    notice_words,
    parse_duration,
    parse_policies,
    plan_reclaims,
)
from ..pool.reclaimpolicy import DURATION_FIELDS
from ..pool.workloads import idle_reclaimable
from .errors import StoreError
from .presence import PresenceStore
from .rows import (
    epoch,
    from_epoch,
    lease_info,
    set_reclaim_state,
    ts,
    upsert_insert,
)
from .utilization import Device, Minute, UtilizationStore, window_samples
from .views import EVERY_HUB, EveryHub

#: What the reclaimer saw of one lease: its server's kernels and its user (either may be None).
Observation = tuple[KernelView | None, PresenceView | None]
#: States the reclaimer looks at: bound leases (a grant not bound yet is not idle, it starts).
WATCHED = ("active", "reclaiming")
#: Audit kinds of a finished reclaim (the user page's history).
FINISHED = ("reclaimed", "reclaim-failed")
#: The outcomes a reclaimer reports.
FINISHED_RESULTS = ("done", "failed")
#: Lease-ttl bounds of the leader lock (seconds).
LEADER_TTL = (5.0, 600.0)


def policy_json(policy: ReclaimPolicy) -> dict[str, Any]:
    """A resolved policy as JSON (durations in seconds, name sets as sorted lists)."""
    out = asdict(policy)
    out["exempt_users"] = sorted(policy.exempt_users)
    out["exempt_groups"] = sorted(policy.exempt_groups)
    return out


#: The longest duration a policy may name (a year): deadlines stay within the calendar.
MAX_DURATION = 366 * 86400.0


def _check_bounds(section: Mapping[str, Any]) -> None:
    """Every duration of the section within ``MAX_DURATION`` (errors name the field)."""
    levels: list[tuple[str, object]] = [("reclaim.default", section.get("default"))]
    for group in ("priority_classes", "offers"):
        for name, body in (section.get(group) or {}).items():
            levels.append((f"reclaim.{group}.{name}", body))
    for where, body in levels:
        # parse_policies has checked the shape: each level is a mapping or absent
        for key, value in body.items() if isinstance(body, Mapping) else ():
            name = f"{where}.{key}"
            too_long = key in DURATION_FIELDS and value is not None
            if too_long and parse_duration(value, name) > MAX_DURATION:
                raise ConfigError("must be at most 366 days", field=name)


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
                f"{row.holder} leads until {ts(row.expires)}"
                if row.holder and row.expires and row.expires > self.clock()
                else "nobody leads; take the lead first"
            )
            raise StoreError(
                "not_leader", f"{holder!r} is not the reclaim leader: {who}", field="holder"
            )

    def take_leader(self, holder: str, ttl: float = 60.0, *, actor: str = "") -> dict[str, Any]:
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
                    f"{row.holder} leads the reclaimer until {ts(row.expires)}",
                    field="holder",
                )
            if row.holder != holder:
                self._event(db, "reclaim-leader", actor, data={"holder": holder, "was": row.holder})
            row.holder, row.expires = holder, now + timedelta(seconds=ttl)
            return {"holder": holder, "expires": ts(row.expires), "leader": True}

    def give_up_leader(self, holder: str, *, actor: str = "") -> dict[str, Any]:
        """``holder`` stops leading (another replica may take over at once); a holder that
        does not lead changes nothing."""
        with self.writing() as db:
            row = self._leader_row(db)
            if row.holder == holder:
                row.holder, row.expires = None, None
                self._event(db, "reclaim-leader", actor, data={"holder": None, "was": holder})
            live = row.expires is not None and row.expires > self.clock()
            return {
                "holder": row.holder if live else None,
                "expires": ts(row.expires) if live else None,
                "leader": False,
            }

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

    def reclaim_leases(self, offset: int = 0, limit: int = 200) -> tuple[list[dict[str, Any]], int]:
        """Live leases the reclaimer watches (``active``, ``reclaiming``), oldest grant first."""
        with self.locked() as alloc, self.read() as db:
            q = select(orm.LeaseRow).where(self._watched())
            total = db.scalar(select(func.count()).select_from(q.subquery())) or 0
            rows = db.scalars(
                q.order_by(orm.LeaseRow.granted, orm.LeaseRow.id).offset(offset).limit(limit)
            ).all()
            return [
                {
                    "id": r.id,
                    "user": r.user,
                    "server": r.server,
                    "offer": r.offer,
                    "state": r.state,
                    "node": r.node,
                    "granted_at": ts(r.granted),
                    # where to read the server without the proxy (None: through it)
                    "server_url": r.server_url,
                    "reclaim": self._reclaim_json(db, alloc, r) if r.reclaim_kind else None,
                }
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
    ) -> dict[str, Any]:
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
            decisions = plan_reclaims(
                [lease_info(r) for r in free],
                {r.id: self._signals(alloc, r, window, observed.get(r.id), samples) for r in free},
                policies,
                alloc.queue(now),
                alloc.quotas,
                now,
                offers=alloc.offers,
                stale_after=self.reclaim_stale_after,
            )
            by_id = {r.id: r for r in free}
            answers = [self._apply(db, alloc, by_id[d.lease], d, actor) for d in decisions]
            answers += [self._claimed(db, r, now, actor) for r in claimed]
            return {
                "now": now,
                "decisions": answers,
                "stale": sum(1 for a in answers if a["kind"] == "stale"),
            }

    def _answer(self, row: orm.LeaseRow, kind: str, reason: str, **extra: Any) -> dict[str, Any]:
        offer = self._allocator.offers.get(row.offer) if self._allocator is not None else None
        out = {
            "lease": row.id,
            "user": row.user,
            "server": row.server,
            "offer": row.offer,
            # what people read (the notify hook's messages): the display name, not the id
            "offer_name": (offer.display_name if offer is not None else "") or row.offer,
            "kind": kind,
            "reason": reason,
        }
        out.update({k: v for k, v in extra.items() if v is not None})
        return out

    def _apply(
        self, db: Session, alloc: Allocator, row: orm.LeaseRow, d: Decision, actor: str
    ) -> dict[str, Any]:
        """Persist one decision; audit notices, cancellations and claims with their evidence."""
        evidence = asdict(d.evidence) if d.evidence is not None else None
        actor = actor or "system"
        if isinstance(d, Act):
            return self._act(db, alloc, row, d, evidence, actor)
        set_reclaim_state(row, d.state)
        if isinstance(d, Notice):
            rec = d.reclaiming
            row.state = "reclaiming"
            self._event(
                db,
                "reclaim-notice",
                actor,
                row,
                {
                    "kind": rec.kind,
                    "deadline": ts(from_epoch(rec.deadline)),
                    "reason": rec.reason,
                    "action": rec.action,
                    "pressure": rec.pressure,
                    "for_request": rec.for_request,
                    "evidence": evidence,
                },
            )
            policy = self.reclaim_policies(db, alloc.offers).for_offer(
                alloc.offers.get(row.offer) or row.offer
            )
            words = notice_words(rec.kind, d.state.extensions, policy.max_extensions, False)
            return self._answer(
                row,
                "notice",
                rec.reason,
                action=rec.action,
                deadline=ts(from_epoch(rec.deadline)),
                evidence=evidence,
                notice_kind=rec.kind,
                heading=words["heading"],
                keep=words["keep"],
                why_not_kept=words["why_not_kept"],
            )
        if isinstance(d, Cancel):
            row.state = "active"
            self._event(
                db, "reclaim-cancelled", actor, row, {"reason": d.reason, "evidence": evidence}
            )
            return self._answer(row, "cancel", d.reason, evidence=evidence)
        assert isinstance(d, NoAction)
        return self._answer(row, d.kind, d.reason, evidence=evidence)

    def _act(
        self,
        db: Session,
        alloc: Allocator,
        row: orm.LeaseRow,
        d: Act,
        evidence: dict[str, Any] | None,
        actor: str,
    ) -> dict[str, Any]:
        """Claim the action; a shrink first reserves its target (make-before-break), and
        waits under notice while the smaller offer cannot be had at once."""
        target: dict[str, Any] | None = None
        shrink_to = d.action.partition(":")[2] if d.action.startswith("shrink:") else None
        if shrink_to:
            try:
                target = self.resize(row.id, shrink_to, actor=actor, check_cap=False)
            except StoreError as e:
                why = f"{d.action} is not possible now ({e.message}); the notice stays"
                return self._answer(row, "deferred", why, action=d.action, evidence=evidence)
            if target["state"] != "granted":
                self._finish(db, alloc, self.lease_row(db, target["id"]), "cancelled", actor)
                why = f"{shrink_to} has no room now; the notice stays until it has"
                return self._answer(row, "deferred", why, action=d.action, evidence=evidence)
        set_reclaim_state(row, d.state)
        row.reclaim_acting, row.reclaim_release = self.clock(), d.release_reason
        row.reclaim_target = target["id"] if target else None
        self._event(
            db,
            "reclaim-acting",
            actor,
            row,
            {
                "action": d.action,
                "reason": d.reason,
                "release_reason": d.release_reason,
                "target_lease": row.reclaim_target,
                "evidence": evidence,
            },
        )
        return self._answer(
            row,
            "act",
            d.reason,
            action=d.action,
            deadline=ts(row.reclaim_deadline),
            release_reason=d.release_reason,
            target_offer=shrink_to,
            target_lease=row.reclaim_target,
            evidence=evidence,
        )

    def _claimed(self, db: Session, row: orm.LeaseRow, now: float, actor: str) -> dict[str, Any]:
        """A lease whose action was claimed: wait for its outcome, or hand the action out
        again once the claim is older than ``reclaim_claim_timeout``."""
        assert row.reclaim_acting is not None
        since = epoch(row.reclaim_acting)
        if now - since < self.reclaim_claim_timeout:
            why = f"being reclaimed ({row.reclaim_action}) since {ts(row.reclaim_acting)}"
            return self._answer(row, "none", why)
        row.reclaim_acting = self.clock()
        self._event(
            db,
            "reclaim-acting",
            actor or "system",
            row,
            {"action": row.reclaim_action, "again": True, "claimed": ts(from_epoch(since))},
        )
        shrink_to = (row.reclaim_action or "").partition(":")[2] or None
        return self._answer(
            row,
            "act",
            row.reclaim_reason or "",
            action=row.reclaim_action,
            deadline=ts(row.reclaim_deadline),
            release_reason=row.reclaim_release,
            target_offer=shrink_to,
            target_lease=row.reclaim_target,
        )

    # -- the outcome of an action ------------------------------------------------------------

    def acting_row(self, db: Session, lease_id: str) -> orm.LeaseRow:
        """The lease whose claimed reclaim is being carried out (``not_acting`` otherwise):
        the reclaimer and the service's own enforcement report their outcome on it."""
        row = self.lease_row(db, lease_id)
        if row.reclaim_acting is None:
            raise StoreError(
                "not_acting", f"no reclaim of lease {lease_id} is being carried out", field="id"
            )
        return row

    def reclaim_outcome(
        self,
        lease_id: str,
        holder: str,
        result: str,
        saved: Iterable[str] = (),
        detail: str = "",
        *,
        actor: str = "",
    ) -> dict[str, Any]:
        """The reclaimer carried out (``done``) or could not carry out (``failed``) a claimed
        action: the lease is released with its claimed reason, or goes back to its user."""
        if result not in ("done", "failed"):
            raise StoreError(
                "invalid_field",
                f"unknown result {result!r}",
                field="result",
                allowed=FINISHED_RESULTS,
            )
        saved = [str(p) for p in saved]
        with self.transaction() as (db, alloc):
            self._check_leader(db, holder)
            row = self.acting_row(db, lease_id)
            actor = actor or "system"
            data = outcome_data(row, result, detail, target_lease=row.reclaim_target, saved=saved)
            if result == "done":
                if row.state in LIVE_STATES:
                    self._finish(db, alloc, row, row.reclaim_release or "reclaimed-idle", actor)
                row.reclaim_acting = None
                self._event(db, "reclaimed", actor, row, data)
            else:
                target = db.get(orm.LeaseRow, row.reclaim_target) if row.reclaim_target else None
                if target is not None and target.state in ("queued", *LIVE_STATES):
                    self._finish(db, alloc, target, "cancelled", actor)
                row.reclaim_acting = row.reclaim_release = row.reclaim_target = None
                if row.state in LIVE_STATES:
                    # the user keeps the GPU; the counts start again (with the grace after work)
                    set_reclaim_state(row, ReclaimState(last_busy=self._now_s()))
                    row.state = "active"
                self._event(db, "reclaim-failed", actor, row, data)
            return self._lease_json(db, alloc, row)

    # -- the admin's policies ----------------------------------------------------------------

    def reclaim_policy(self) -> dict[str, Any]:
        """The ``reclaim`` section in effect, where it comes from, and each offer's resolved
        policy."""
        with self.locked() as alloc, self.read() as db:
            section, source = self.reclaim_section(db)
            policies = self.reclaim_policies(db, alloc.offers)
            return {
                "source": source,
                "reclaim": section or {},
                "effective": {
                    "default": policy_json(policies.default),
                    "offers": {
                        name: policy_json(policies.for_offer(o)) for name, o in alloc.offers.items()
                    },
                },
            }

    def put_reclaim_policy(self, section: Mapping[str, Any], *, actor: str = "") -> dict[str, Any]:
        """Replace the ``reclaim`` section (validated against today's offers; an error names
        ``reclaim.<level>.<field>``); it wins over the pool config file until deleted."""
        with self.transaction() as (db, alloc):
            try:
                parse_policies(section, alloc.offers, catalog=self.catalog)
                _check_bounds(section)
            except PoolError as e:
                message = e.message
                if e.allowed is not None and " (allowed:" in message:
                    message = message[: message.rfind(" (allowed:")]
                raise StoreError(
                    "invalid_field", message, field=e.field or "reclaim", allowed=e.allowed
                ) from None
            row = db.get(orm.ReclaimPolicyRow, 1)
            if row is None:
                row = orm.ReclaimPolicyRow(id=1)
                db.add(row)
            row.spec, row.actor, row.updated = dict(section), actor, self.clock()
            self._event(db, "reclaim-policy-set", actor, data={"reclaim": dict(section)})
        return self.reclaim_policy()

    def reset_reclaim_policy(self, *, actor: str = "") -> dict[str, Any]:
        """Drop the admin's override: the pool config file's section (or the defaults) apply."""
        with self.transaction() as (db, _):
            row = db.get(orm.ReclaimPolicyRow, 1)
            if row is not None:
                db.delete(row)
                self._event(db, "reclaim-policy-reset", actor)
        return self.reclaim_policy()

    # -- the user's page ---------------------------------------------------------------------

    def user(
        self, name: str, groups: Iterable[str] = (), hub: str | EveryHub | None = EVERY_HUB
    ) -> dict[str, Any]:
        """A user's quota, use, leases and notices (the leases of ``hub`` only, when given:
        quota and use are the user's across the hubs), and the user's recent reclaims and
        withdrawn notices."""
        with self.locked() as alloc:
            leases, _ = self.leases(user=name, limit=100, hub=hub)
            live = [le for le in leases if le["state"] != "released"]
            spec = alloc.quotas.user_spec(name)
            notices = [
                {
                    "lease": le["id"],
                    "kind": "reclaim",
                    "message": le["reclaim"]["reason"],
                    "reason": le["reclaim"]["reason"],
                    "action": le["reclaim"]["action"],
                    "deadline": le["reclaim"]["deadline"],
                }
                for le in live
                if le["reclaim"]
            ]
            out = {
                "name": name,
                "groups": list(groups),
                "quota": spec.to_dict(),
                "held_units": float(alloc.quotas.held(name)),
                # a budget applies: what is used (0 when nothing is); none applies: null
                "used_unit_hours": None
                if spec.budget is None
                else alloc.quotas.used_hours.get(name, 0.0),
                "leases": live,
                "notices": notices,
            }
        out["reclaims"] = self.recent_reclaims(name)
        out["withdrawn"] = self.withdrawn_notices(name)
        return out

    def withdrawn_notices(
        self, user: str, hours: float = 24.0, limit: int = 5
    ) -> list[dict[str, Any]]:
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
                data = e.data or {}
                if not data.get("by_admin"):
                    continue
                row = db.get(orm.LeaseRow, e.lease_id) if e.lease_id else None
                out.append(
                    {
                        "lease": e.lease_id,
                        "offer": row.offer if row else None,
                        "server": row.server if row else None,
                        "at": ts(e.ts),
                        "kind": data.get("kind"),
                        "reason": data.get("reason") or "",
                    }
                )
        return out[:limit]

    def recent_reclaims(
        self, user: str, days: float = 7.0, limit: int = 20
    ) -> list[dict[str, Any]]:
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
            data = e.data or {}
            out.append(
                {
                    "lease": e.lease_id,
                    "offer": row.offer if row else None,
                    "server": row.server if row else None,
                    "at": ts(e.ts),
                    "kind": data.get("kind"),
                    "action": data.get("action"),
                    "reason": data.get("reason"),
                    "release_reason": data.get("release_reason") if e.kind == "reclaimed" else None,
                    "saved": list(data.get("saved") or []),
                    "outcome": "done" if e.kind == "reclaimed" else "failed",
                    "detail": data.get("detail") or "",
                    "utilization": self._last_hour(row, e) if row else [],
                }
            )
        return out

    def _last_hour(self, row: orm.LeaseRow, event: orm.EventRow) -> list[dict[str, Any]]:
        """The lease's minutes over the hour before it ended (or before the event), one entry
        per minute (the mean over its devices, the most memory any held)."""
        end = row.released or event.ts
        start = (end - timedelta(hours=1)).replace(second=0, microsecond=0)
        if row.granted is not None:
            start = max(start, row.granted.replace(second=0, microsecond=0))
        devices = [(s.gpu_uuid, s.start if s.kind == "mig" else None) for s in row.slots]
        if not devices:
            return []
        merged: dict[float, list[Minute]] = {}
        for m in self.minutes(devices, start, end):
            merged.setdefault(float(m["ts"]), []).append(m)
        out = []
        for minute, ms in sorted(merged.items()):
            utils = [m["util_mean"] for m in ms if m["util_mean"] is not None]
            out.append(
                {
                    "minute": ts(from_epoch(minute)),
                    "util_mean": sum(utils) / len(utils) if utils else None,
                    "memory_used_mib_max": max(int(m["memory_used_mib_max"]) for m in ms),
                }
            )
        return out


def outcome_data(row: orm.LeaseRow, outcome: str, detail: str, **extra: Any) -> dict[str, Any]:
    """The audit data of a reclaim's outcome: what was claimed, and how it ended."""
    return {
        "kind": row.reclaim_kind,
        "action": row.reclaim_action,
        "reason": row.reclaim_reason,
        "release_reason": row.reclaim_release,
        **extra,
        "detail": detail,
        "outcome": outcome,
    }

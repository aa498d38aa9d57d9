"""The one applier: the pool's decisions become rows and audit events here, and only here.

``pool.decide`` says what is to happen as effects (``pool.effects``); ``_apply_effects``
makes each one true, in order, in the caller's transaction: in the allocator
(``pool.effects.apply_effect``, the pool's own state) and in the rows. ``_record`` writes a
grant or a queued request into its row; ``_finish`` ends a lease by the pool's rule
(``pool.ending.finish``: the queue served with what it frees, the owner's borrowed flags, its
pending resize targets) and applies what it decided; ``_serve_queue`` does the same for a queue
pass. Every caller that ends a lease or serves the queue (release, expiry, reconcile,
approvals, reclaims, node actions, quota edits, MIG results, inventory) goes through them.

A lease's holder follows it here, by the rules of ``pool.holders``: a job is granted with its
lease, and ends when its lease ends another way than its runner's report. There is one
``_record`` and one ``_released``, whoever holds the lease.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator, Grant, Queued
from ..pool.decide import decide
from ..pool.effects import (
    AwaitingApproval,
    BorrowedChanged,
    Effect,
    JobCancelling,
    JobEnded,
    JobPreempting,
    JobSeen,
    JobStarted,
    JobSubmitted,
    KeptAlive,
    KernelBusy,
    KernelNoticeCancelled,
    KernelNoticed,
    KernelRequested,
    LeaseActivated,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewLease,
    NodeFlagsSet,
    NodeHeld,
    NoticeExtended,
    NoticeGiven,
    NoticeWithdrawn,
    QuotaReset,
    QuotaSet,
    RequestApproved,
    RequestDenied,
    RestartMarked,
    SharingSet,
    apply_effect,
)
from ..pool.ending import ended_reason, finish, serve_queue
from ..pool.errors import Refusal
from ..pool.facts import RESTARTING, LeaseFacts, Outcome, PoolState
from ..pool.holders import job_after_lease, job_granted, job_of
from ..pool.kernels import KERNEL_HOLDER
from ..pool.model import Request
from ..pool.workloads import JOB_HOLDER
from ..timeparse import format_time
from .bulk import queue_release, stage_lease
from .configapply import CONFIG_EFFECTS, ConfigApplier
from .errors import StoreError
from .nodeapply import (
    INVENTORY_EFFECTS,
    MIG_EFFECTS,
    NODE_EFFECTS,
    REPARTITION_EFFECTS,
    NodeApplier,
)
from .read.jobs import live_devices
from .reclaimapply import RECLAIM_EFFECTS, ReclaimApplier
from .rows import aware, from_epoch, new_row, set_quota, set_reclaim_state, slot_row

#: A job's and a kernel's effects (``Applier._job_or_kernel``).
_JOBS_AND_KERNELS = (
    JobSubmitted,
    JobEnded,
    JobSeen,
    JobStarted,
    JobCancelling,
    JobPreempting,
    KernelRequested,
    KernelBusy,
    KernelNoticed,
    KernelNoticeCancelled,
)
#: States of a resize target that still stands (``LeaseRow.resize_of`` names its lease).
TARGET_STATES = ("awaiting_approval", "queued", "granted", "active", "reclaiming")
__all__ = ["RESTARTING", "TARGET_STATES", "Applier", "LazyFacts", "decided", "lease_facts"]


class Applier(NodeApplier, ReclaimApplier, ConfigApplier):
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
        row.state, row.reason, row.message, row.held_node = "granted", None, None, None
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
            row.slots.append(slot_row(slot))
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
        job_id = job_of(row.holder, row.server)
        if job_id is not None:
            row.expires = None  # no server binds it: the runner reports, or the timeout ends it
            job = db.get(orm.JobRow, job_id)
            if job is not None and job_granted(job.state):
                job.state, job.node = "granted", row.node
                job.devices = self._job_devices(self._allocator, row)
                self._job_event(db, "job-granted", "system", job)

    def _apply_effects(
        self,
        db: Session,
        alloc: Allocator | None,
        effects: Iterable[Effect],
        actor: str = "",
        rows: Mapping[str, orm.LeaseRow] | None = None,
        now_s: float | None = None,
    ) -> dict[str, orm.LeaseRow]:
        """Make ``effects`` true, in order: in ``alloc`` (None: it is rebuilt from the rows
        afterwards) and in the rows. ``rows``: lease rows the caller holds already; ``now_s``:
        the time the effects were decided at (epoch seconds; None: now). Returns the rows of
        the new requests, by id."""
        made: dict[str, orm.LeaseRow] = {}
        if now_s is None:
            now_s = self._now_s()
        known = dict(rows or {})
        for effect in effects:
            if isinstance(effect, _JOBS_AND_KERNELS):
                self._job_or_kernel(db, alloc, effect, actor, {**known, **made})
                continue  # a job's end applies its lease's end itself
            if alloc is not None:
                apply_effect(alloc, effect, now_s)
            if isinstance(effect, (LeaseGranted, LeaseQueued)):
                decision = effect.grant if isinstance(effect, LeaseGranted) else effect.queued
                if effect.new is not None:
                    row = made[decision.request.id] = self._new_lease(
                        decision.request, effect.new, decision.group, decision.units
                    )
                    stage_lease(db, row)
                    self._record(db, row, decision, actor)
                else:
                    waiter = self.pending_or_stored(db, decision.request.id)
                    if waiter is not None:
                        self._record(db, waiter, decision, actor)
            elif isinstance(effect, AwaitingApproval):
                made[effect.request.id] = self._awaiting_row(db, effect, actor)
            elif isinstance(effect, LeaseReleased):
                row = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
                self._released(db, row, effect, actor)
            elif isinstance(effect, NodeHeld):  # the sticky hold (``pool.headroom``)
                held = self.pending_or_stored(db, effect.lease_id)
                if held is not None and held.state == "queued":
                    held.held_node = effect.node
            elif isinstance(effect, BorrowedChanged):
                flagged = self.pending_or_stored(db, effect.lease_id)
                if flagged is not None and flagged.borrowed != effect.borrowed:
                    flagged.borrowed = effect.borrowed
                    kind = "borrowed" if flagged.borrowed else "within-guarantee"
                    self._event(db, kind, "system", flagged)
            elif isinstance(effect, QuotaSet):
                self._quota_set(db, effect, actor)
            elif isinstance(effect, QuotaReset):
                self._quota_reset(db, effect, actor)
            elif isinstance(effect, SharingSet):
                for uuid, mode in effect.modes:
                    gpu = db.scalar(select(orm.GpuRow).where(orm.GpuRow.uuid == uuid))
                    if gpu is not None:
                        gpu.sharing = mode
                data = {"node": effect.node, "gpus": dict(effect.modes)}
                self._event(db, "sharing-advertised", actor, data=data)
            elif isinstance(effect, NodeFlagsSet):
                node = orm.NodeRow.find(db, effect.node)
                if node is not None:
                    for flag in ("cordoned", "draining"):
                        if getattr(effect, flag) is not None:
                            setattr(node, flag, getattr(effect, flag))
                self._event(db, f"node-{effect.action}", actor, data={"node": effect.node})
            elif isinstance(effect, RECLAIM_EFFECTS):  # ``store/reclaimapply.py``
                self._reclaim_applied(db, effect, actor, known)
            # -- nodes and inventory (``store/nodeapply.py``)
            elif isinstance(effect, INVENTORY_EFFECTS):
                self._inventory_changed(db, effect)
            elif isinstance(effect, NODE_EFFECTS):
                self._node_changed(db, effect, actor, known)
            elif isinstance(effect, REPARTITION_EFFECTS):
                self._repartition_changed(db, effect, actor)
            elif isinstance(effect, MIG_EFFECTS):
                self._mig_changed(db, effect, actor, known)
            # -- the pool config (``store/configapply.py``)
            elif isinstance(effect, CONFIG_EFFECTS):
                self._config_changed(db, alloc, effect)
            else:
                self._lease_changed(db, effect, actor, known)
        return made

    def _lease_changed(
        self,
        db: Session,
        effect: Effect,
        actor: str,
        known: Mapping[str, orm.LeaseRow],
    ) -> None:
        """A lease's binding or notice changes (rows only; the allocator has no part in it)."""
        changes = (
            KeptAlive,
            LeaseActivated,
            RestartMarked,
            NoticeExtended,
            NoticeWithdrawn,
            NoticeGiven,
            RequestDenied,
            RequestApproved,
        )
        if not isinstance(effect, changes):
            return  # a waiter's reason: kept in memory only
        now = self.clock()
        row = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
        if isinstance(effect, KeptAlive):
            row.keepalive = now
        elif isinstance(effect, LeaseActivated):
            row.state, row.activated, row.expires = "active", now, None
            self._event(db, "activated", actor, row)
        elif isinstance(effect, RestartMarked):
            row.reason = RESTARTING
        elif isinstance(effect, NoticeExtended):
            set_reclaim_state(row, effect.state)
            row.state, row.keepalive = "active", now
            until = format_time(from_epoch(effect.until))
            data = {"extensions": effect.extensions, "limit": effect.limit, "until": until}
            self._event(db, "reclaim-extended", actor or row.user, row, data)
        elif isinstance(effect, NoticeWithdrawn):
            set_reclaim_state(row, effect.state)
            row.state = "active"
            data = {"reason": effect.why, "kind": effect.kind, "by_admin": True}
            self._event(db, "reclaim-cancelled", actor, row, {**data, "notice": effect.notice})
        elif isinstance(effect, NoticeGiven):
            rec = effect.state.reclaiming
            assert rec is not None
            set_reclaim_state(row, effect.state)
            row.state = "reclaiming"
            data = {"kind": rec.kind, "deadline": format_time(from_epoch(rec.deadline))}
            self._event(
                db,
                "reclaim-notice",
                actor,
                row,
                {**data, "reason": rec.reason, "action": rec.action},
            )
        elif isinstance(effect, RequestApproved):
            ask = dict(row.approval or {})
            duration, note = effect.duration, effect.note or None
            ask.update(
                decision="approved",
                decided=format_time(now),
                decided_by=actor,
                note=note,
                approved_duration=duration,
            )
            if effect.offer != row.offer:
                ask["asked_offer"], row.offer = row.offer, effect.offer
            row.approval = ask
            row.lapses = None if duration is None else now + timedelta(seconds=duration)
            row.units, row.units_f = str(effect.units), float(effect.units)
            said: dict[str, Any] = {"duration": duration, "offer": row.offer, "note": note}
            self._event(db, "approved", actor, row, said)
        else:
            ask = dict(row.approval or {})
            ask.update(
                decision="denied", decided=format_time(now), decided_by=actor, note=effect.reason
            )
            row.approval, row.message = ask, f"denied: {effect.reason}"
            self._event(db, "denied", actor, row, {"reason": effect.reason})

    def _new_lease(
        self, request: Request, new: NewLease, group: str | None, units: Fraction
    ) -> orm.LeaseRow:
        """The row of a request asked now (granted or queued: ``_record`` says which)."""
        return new_row(
            orm.LeaseRow,
            id=request.id,
            user=request.user,
            server=request.server,
            offer=request.offer,
            group=group,
            groups=list(request.groups),
            clusters=list(request.clusters) or None,
            hub=new.hub,
            priority=request.priority,
            created=self.clock(),
            units=str(units),
            units_f=float(units),
            resize_of=new.resize_of,
            borrowed=False,  # set here, not by column defaults: the JSON is built pre-flush
            within_guarantee=True,
            busy_hours=0.0,
            replicas=request.replicas,
        )

    def _awaiting_row(self, db: Session, effect: AwaitingApproval, actor: str) -> orm.LeaseRow:
        """Write a request that waits for an administrator: it holds nothing meanwhile."""
        now, request, ask = self.clock(), effect.request, effect.ask
        row = orm.LeaseRow(
            id=request.id,
            user=request.user,
            server=request.server,
            offer=request.offer,
            group=request.group,
            groups=list(request.groups),
            clusters=list(request.clusters) or None,
            hub=effect.new.hub,
            priority=request.priority,
            created=now,
            state="awaiting_approval",
            message=ask.message,
            units=str(ask.units),
            units_f=float(ask.units),
            borrowed=False,
            within_guarantee=True,
            busy_hours=0.0,
            exception=ask.exception,
            resize_of=effect.new.resize_of,
            replicas=request.replicas,
            approval={
                "required_by": list(ask.required_by),
                "reason": effect.reason,
                "duration": effect.duration,
                "asked": format_time(now),
                "ceiling": None if ask.ceiling is None else float(ask.ceiling),
                "decision": None,
                "decided": None,
                "decided_by": None,
                "note": None,
            },
        )
        db.add(row)
        self.note_awaiting(request.user, request.server, request.id)
        self._event(
            db,
            "approval-requested",
            actor or request.user,
            row,
            {
                "required_by": list(ask.required_by),
                "reason": effect.reason,
                "duration": effect.duration,
                "units": float(ask.units),
            },
        )
        return row

    def _released(self, db: Session, row: orm.LeaseRow, effect: LeaseReleased, actor: str) -> None:
        """The rows of a lease that ends: its state, slots and the MIG instances made for it;
        a job it held ends with it (``pool.holders.job_after_lease``), unless it has already."""
        now = self.clock()
        if not queue_release(db, row, now, effect.reason):  # else written with the batch's
            row.state, row.released, row.release_reason = "released", now, effect.reason
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
        self._event(db, "released", actor, row, {"reason": effect.reason, "from": effect.was})
        job_id = job_of(row.holder, row.server)
        job = db.get(orm.JobRow, job_id) if job_id is not None else None
        ends = job_after_lease(job.state, effect.reason) if job is not None else None
        if job is not None and ends is not None:
            # the lease ended another way than the runner's report (an admin, a lost node)
            job.state, job.reason = ends
            job.ended = now
            self._job_event(db, "job-ended", actor or "system", job)

    # -- a job follows its lease -----------------------------------------------------------

    @staticmethod
    def _lease_of(db: Session, job: orm.JobRow) -> orm.LeaseRow | None:
        return db.get(orm.LeaseRow, job.lease_id) if job.lease_id else None

    def _job_event(self, db: Session, kind: str, actor: str, job: orm.JobRow, **data: Any) -> None:
        lease = self._lease_of(db, job)
        body = {"job": job.id, "name": job.name, "state": job.state, **data}
        if job.reason:
            body["reason"] = job.reason
        self._event(db, kind, actor or "system", lease, body)

    @staticmethod
    def _job_devices(alloc: Allocator | None, row: orm.LeaseRow) -> list[dict[str, Any]]:
        """What the job runs on (``read.jobs.live_devices``), as its row keeps it: each GPU's
        uuid and index on its node, and its MIG instance (profile, start, uuid once made) or
        null."""
        return [asdict(d) for d in live_devices(alloc, row)]

    # -- jobs and kernels --------------------------------------------------------------------

    def _job_or_kernel(
        self,
        db: Session,
        alloc: Allocator | None,
        effect: Effect,
        actor: str,
        known: Mapping[str, orm.LeaseRow],
    ) -> None:
        """A job's or a kernel's effect: its row (a kernel's is its lease's) and audit. A job
        that ends takes its lease along: that end's effects are applied here, after the job's
        state (so the lease's end leaves the job as it is) and before the job's audit event,
        as the pool's own act (audited as the system's)."""
        now = self.clock()
        if isinstance(effect, JobSubmitted):
            self._job_submitted(db, alloc, effect, actor, known)
        elif isinstance(effect, JobEnded):
            job = self._job(db, effect.job_id)
            job.state, job.ended = effect.state, now
            if effect.reason is not None:
                job.reason = effect.reason
            if effect.exit_code is not None:
                job.exit_code = effect.exit_code
            self._apply_effects(db, alloc, effect.lease, "system", known)
            self._job_event(db, effect.event, actor, job, **dict(effect.data))
        elif isinstance(effect, JobSeen):
            job = self._job(db, effect.job_id)
            job.runner_seen = now
            if effect.pid is not None:
                job.pid = effect.pid
        elif isinstance(effect, JobStarted):
            job = self._job(db, effect.job_id)
            job.state, job.started = "running", now
            self._job_event(db, "job-running", actor, job, pid=effect.pid)
        elif isinstance(effect, JobCancelling):
            job = self._job(db, effect.job_id)
            job.state = "cancelling"
            self._job_event(db, "job-cancelling", actor, job)
        elif isinstance(effect, JobPreempting):
            job = self._job(db, effect.job_id)
            job.state, job.reason = "preempting", effect.reason
            job.notice_deadline = from_epoch(effect.deadline)
            if effect.notice is not None or effect.for_request is None:
                self._job_event(db, "job-preempting", actor, job, notice=effect.notice)
            else:
                said = {
                    "deadline": format_time(job.notice_deadline),
                    "for_request": effect.for_request,
                }
                self._job_event(db, "job-preempting", actor, job, **said)
        else:
            self._kernel_changed(db, effect, actor, known)

    def _job_submitted(
        self,
        db: Session,
        alloc: Allocator | None,
        effect: JobSubmitted,
        actor: str,
        known: Mapping[str, orm.LeaseRow],
    ) -> None:
        """The job's row, and its lease made the job's."""
        new = effect.job
        row = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
        row.holder, row.workload, row.expires = JOB_HOLDER, new.workload, None
        job = orm.JobRow(
            id=new.id,
            user=new.user,
            group=row.group,
            name=new.name,
            runner=new.runner,
            runner_ref=dict(new.runner_ref) if new.runner_ref is not None else None,
            offer=new.offer,
            workload=new.workload,
            command=list(new.command),
            env=dict(new.env) if new.env is not None else None,
            cwd=new.cwd,
            state="granted" if row.state == "granted" else "queued",
            lease_id=row.id,
            node=row.node,
            devices=self._job_devices(alloc, row),
            created=self.clock(),
            log="",
            log_start=0,
        )
        db.add(job)
        said = {"job": job.id, "name": job.name, "class": new.workload, "state": job.state}
        self._event(db, "job-submitted", actor or new.user, row, said)

    def _kernel_changed(
        self, db: Session, effect: Effect, actor: str, known: Mapping[str, orm.LeaseRow]
    ) -> None:
        """A kernel's effect: its lease's row."""
        assert isinstance(
            effect, (KernelRequested, KernelBusy, KernelNoticed, KernelNoticeCancelled)
        )
        now = self.clock()
        row = known.get(effect.lease_id) or self.lease_row(db, effect.lease_id)
        if isinstance(effect, KernelRequested):
            row.holder, row.workload, row.expires = KERNEL_HOLDER, effect.workload, None
            row.keepalive, row.last_input, row.presence_source = now, now, "kernel"
        elif isinstance(effect, KernelBusy):
            row.last_input = now
        elif isinstance(effect, KernelNoticed):
            row.reclaim_deadline = from_epoch(effect.deadline)
            row.reclaim_reason = effect.reason
            said = {"deadline": format_time(row.reclaim_deadline)}
            self._event(db, "kernel-notice", actor, row, said)
        else:
            row.reclaim_deadline, row.reclaim_reason = None, None
            self._event(db, "kernel-notice-cancelled", actor, row)

    @staticmethod
    def _job(db: Session, job_id: str) -> orm.JobRow:
        job = db.get(orm.JobRow, job_id)
        assert job is not None  # the store read it for the decision
        return job

    # -- quotas ----------------------------------------------------------------------------

    def _quota_set(self, db: Session, effect: QuotaSet, actor: str) -> None:
        row = db.scalar(
            select(orm.QuotaRow).where(
                orm.QuotaRow.kind == effect.kind, orm.QuotaRow.name == effect.name
            )
        )
        if row is None:
            row = orm.QuotaRow(kind=effect.kind, name=effect.name)
            db.add(row)
        set_quota(row, effect.spec)
        row.source = "api"
        data = {"kind": effect.kind, "name": effect.name, **effect.spec.to_dict()}
        self._event(db, "quota-set", actor, data=data)

    def _quota_reset(self, db: Session, effect: QuotaReset, actor: str) -> None:
        row = db.scalar(
            select(orm.QuotaRow).where(
                orm.QuotaRow.kind == effect.kind, orm.QuotaRow.name == effect.name
            )
        )
        if row is not None:
            if effect.spec is not None:
                set_quota(row, effect.spec)
                row.source = "file"
            else:
                db.delete(row)
        self._event(db, "quota-reset", actor, data={"kind": effect.kind, "name": effect.name})

    def _serve_queue(self, db: Session, alloc: Allocator) -> int:
        """Grant what the queue can have now (``pool.ending.serve_queue``); returns how many."""
        outcome = serve_queue(alloc, self._now_s())
        self._apply_effects(db, alloc, outcome.effects)
        return int(outcome.answer)

    def _finish(
        self, db: Session, alloc: Allocator | None, row: orm.LeaseRow, reason: str, actor: str
    ) -> None:
        """End ``row`` for ``reason`` by the pool's rule (``pool.ending.finish``) and apply
        what it decides. Without ``alloc`` (the allocator is rebuilt from the rows
        afterwards), only the row changes."""
        if alloc is None:
            ended = LeaseReleased(row.id, ended_reason(lease_facts(row), reason), row.state)
            self._apply_effects(db, None, [ended], actor, {row.id: row})
            return
        facts, rows = self._lease_facts(db, alloc, [row])
        outcome = finish(PoolState(alloc, facts), row.id, reason, self._now_s())
        self._apply_effects(db, alloc, outcome.effects, actor, rows)

    def _lease_facts(
        self, db: Session, alloc: Allocator, rows: Iterable[orm.LeaseRow]
    ) -> tuple[dict[str, LeaseFacts], dict[str, orm.LeaseRow]]:
        """What the pool's rules read of ``rows`` (each with its pending resize targets), and
        every row read, by id (for the applier)."""
        facts: dict[str, LeaseFacts] = {}
        held: dict[str, orm.LeaseRow] = {}
        for row in rows:
            targets = self._pending_targets(db, alloc, row)
            held |= {row.id: row, **{t.id: t for t in targets}}
            facts[row.id] = lease_facts(row, tuple(lease_facts(t) for t in targets))
        return facts, held

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


def decided(state: PoolState, command: c.Command, now: float) -> Outcome:
    """``pool.decide.decide``, its refusals as the store's (answered alone in a batch)."""
    try:
        return decide(state, command, now)
    except Refusal as e:
        raise StoreError.of(e) from None


def lease_facts(row: orm.LeaseRow, targets: tuple[LeaseFacts, ...] = ()) -> LeaseFacts:
    """The facts of a lease's row the pool's rules read (``pool.facts.LeaseFacts``)."""
    return LeaseFacts(
        row.id,
        row.user,
        row.server,
        row.state,
        resize_of=row.resize_of,
        reason=row.reason,
        reclaiming=row.reclaim_acting is not None,
        reclaim_release=row.reclaim_release,
        reclaim_target=row.reclaim_target,
        targets=targets,
        holder=row.holder,
        offer=row.offer,
        group=row.group,
        groups=tuple(row.groups or ()),
        clusters=tuple(row.clusters or ()),
        hub=row.hub,
        reclaim_kind=row.reclaim_kind,
        release_reason=row.release_reason,
        claimed_action=None if row.reclaim_acting is None else row.reclaim_action,
        claimed_at=aware(row.reclaim_acting),
    )


class LazyFacts(Mapping[str, LeaseFacts]):
    """``PoolState.leases`` for a command that looks at many leases and ends few (reconcile):
    each lease's facts (with its pending resize targets) read only when a rule asks."""

    def __init__(
        self, applier: Applier, db: Session, alloc: Allocator, rows: Iterable[orm.LeaseRow]
    ) -> None:
        self._applier, self._db, self._alloc = applier, db, alloc
        self._rows = {r.id: r for r in rows}
        self._facts: dict[str, LeaseFacts] = {}
        #: Every row a rule read (with the targets), by id: the applier's ``rows``.
        self.read: dict[str, orm.LeaseRow] = {}

    def __getitem__(self, lease_id: str) -> LeaseFacts:
        if lease_id not in self._facts:
            row = self._rows[lease_id]
            facts, read = self._applier._lease_facts(self._db, self._alloc, [row])
            self._facts[lease_id] = facts[lease_id]
            self.read |= read
        return self._facts[lease_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)


def _waited(row: orm.LeaseRow, now: datetime) -> float | None:
    return (now - row.queued_since).total_seconds() if row.queued_since else None

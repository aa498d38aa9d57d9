"""Job leases: a command run on a lease the job holds, not a hub server (issue 35).

A job's lease is an ordinary lease row (``server`` = ``job:<id>``, ``holder`` = ``job``,
``workload`` = its class), so the queue, usage and chargeback see it as they see servers. The
job row follows its lease: granted when the lease is, ended when the lease ends some other way
(an admin's release, a lost node): the one applier does both (``store/apply.py``, by the rules
of ``pool.holders``). The job runner on the lease's node starts it, reports it alive
(``running``, every round) and reports its exit, which releases the lease. Preemption of a
training job is a notice on the job (``preempting`` with a deadline) that the runner carries
out; the lease goes when the exit is reported, or, if the runner falls silent past
``job_runner_timeout`` (``pool.holders.runner_silent``), at the next reconcile
(``runner_lost``), which is this module's: it reads the jobs' liveness too.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from fractions import Fraction
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.borrowing import owner_surplus
from ..pool.decisions import Lease
from ..pool.errors import PoolError
from ..pool.facts import PoolState
from ..pool.holders import Held, job_server, runner_silent
from ..pool.model import offer_priority
from ..pool.workloads import (
    JOB_HOLDER,
    Holder,
    WorkloadClass,
    check_cwd,
    check_job,
    check_replicas,
    class_for,
    lease_class,
    preempting_reason,
    preemption_rank,
    request_priority,
    waiter_preemption_rank,
)
from .apply import LazyFacts, decided
from .errors import StoreError
from .leases import LeaseStore
from .rows import epoch, ts

#: The most of a job's output the pool keeps (the last characters).
LOG_KEEP = 1024 * 1024
#: States the runner acts on (its node's list).
RUNNER_STATES = ("granted", "cancelling", "preempting")
#: States in which the runner has (or may have) a process: its reports count.
ALIVE_STATES = ("granted", "running", "cancelling", "preempting")


def job_not_found(job_id: str) -> StoreError:
    """The refusal for a job that does not exist (or is not the caller's)."""
    return StoreError("not_found", f"no job {job_id!r}", field="id")


class JobStore(LeaseStore):
    """Jobs: submit, cancel, the runner's reports, preemption and the runner timeout."""

    def __init__(self, *args: Any, job_runner_timeout: float = 120.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        #: Seconds a job's runner may go without a report before its lease is released
        #: (``runner_lost``): ``PoolService.job_runner_timeout``.
        self.job_runner_timeout = job_runner_timeout
        #: Silence is counted from here at the earliest: runners cannot report to a pool that
        #: is down, so a restarted pool gives them the whole timeout again.
        self._runners_watched_from = self.clock()

    @property
    def classes(self) -> Mapping[str, WorkloadClass]:
        """The workload classes of the pool config (the defaults without one)."""
        return self.file_config.classes

    # -- the user's side ---------------------------------------------------------------------

    def submit_job(
        self,
        user: str,
        offer: str,
        command: list[str],
        workload: str = "training",
        name: str = "",
        group: str | None = None,
        groups: Iterable[str] = (),
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        image: str | None = None,
        replicas: object = 1,
        *,
        actor: str = "",
    ) -> dict[str, Any]:
        """Ask for ``offer`` for a job of class ``workload``: its lease is granted or queued
        like a server's; refusals are the allocation's, plus ``unknown_class``,
        ``class_not_allowed``, ``invalid_command``, ``invalid_env``, ``invalid_image`` and
        ``invalid_replicas``. With ``image``, Kubernetes runs it (``kube.kubejobs.KubeJobs``),
        not the local runner. ``replicas`` copies of the offer are one grant, on one node, and
        count against the user's and group's quota (``workloads.check_replicas``)."""
        try:
            command, env_ = check_job(command, env)
            cwd = check_cwd(cwd)
        except PoolError as e:
            raise StoreError(e.code, e.message, field=e.field, allowed=e.allowed) from None
        runner, ref = None, None
        if image is not None:
            # an image reference is printable ASCII without spaces (the spec's pattern)
            if not image or len(image) > 512 or not all("!" <= c <= "~" for c in image):
                raise StoreError(
                    "invalid_image", f"not a container image: {image!r}", field="image"
                )
            runner, ref = "kubernetes", {"image": image}
        return self._new_job(
            user, offer, command, workload, name, group, groups, env_, cwd, actor, runner, ref,
            replicas,
        )  # fmt: skip

    def _new_job(
        self,
        user: str,
        offer: str,
        command: list[str],
        workload: str,
        name: str,
        group: str | None,
        groups: Iterable[str],
        env_: dict[str, str] | None,
        cwd: str | None,
        actor: str,
        runner: str | None = None,
        runner_ref: dict[str, str] | None = None,
        replicas: object = 1,
    ) -> dict[str, Any]:
        """A job's row and its lease (granted or queued); ``runner`` None: the local runner's."""
        groups = tuple(groups)
        try:
            cls = class_for(self.classes, workload, groups)
        except PoolError as e:
            raise StoreError(e.code, e.message, field=e.field, allowed=e.allowed) from None
        job_id = uuid.uuid4().hex
        now = self.clock()
        with self.transaction() as (db, alloc):
            try:
                copies = check_replicas(replicas, cls, alloc.offers.get(offer))
            except PoolError as e:
                raise StoreError(e.code, e.message, field=e.field) from None
            prio = request_priority(self.classes, cls, offer_priority(alloc.offers.get(offer)))
            lease = self.allocate(
                user, job_server(job_id), offer, group=group, groups=groups, priority=prio,
                actor=actor, replicas=copies,
            )  # fmt: skip
            row = self.lease_row(db, lease["id"])
            row.holder, row.workload, row.expires = JOB_HOLDER, cls.name, None
            job = orm.JobRow(
                id=job_id,
                user=user,
                group=row.group,
                # the program's name by default (as long as the column holds)
                name=(name or f"{command[0].rsplit('/', 1)[-1][:200]}-{job_id[:6]}")[:255],
                runner=runner,
                runner_ref=runner_ref,
                offer=offer,
                workload=cls.name,
                command=command,
                env=env_,
                cwd=cwd,
                state="granted" if row.state == "granted" else "queued",
                lease_id=row.id,
                node=row.node,
                devices=self._job_devices(alloc, row),
                created=now,
                log="",
                log_start=0,
            )
            db.add(job)
            self._event(
                db,
                "job-submitted",
                actor or user,
                row,
                {"job": job_id, "name": job.name, "class": cls.name, "state": job.state},
            )
            return self._job_json(db, alloc, job, row)

    def list_jobs(self, user: str | None = None, state: str | None = None) -> list[dict[str, Any]]:
        """Jobs, newest first (``user`` None: everybody's)."""
        with self.locked() as alloc, self.read() as db:
            q = select(orm.JobRow)
            if user is not None:
                q = q.where(orm.JobRow.user == user)
            if state is not None:
                q = q.where(orm.JobRow.state == state)
            rows = db.scalars(q.order_by(orm.JobRow.created.desc(), orm.JobRow.id).limit(1000))
            return [self._job_json(db, alloc, j) for j in rows]

    def job(self, job_id: str) -> dict[str, Any]:
        """One job's JSON, or ``not_found``."""
        with self.locked() as alloc, self.read() as db:
            return self._job_json(db, alloc, self._job_row(db, job_id))

    def job_owner(self, job_id: str) -> str:
        """Whose job it is (``not_found`` if none)."""
        with self.read() as db:
            owner = db.scalar(select(orm.JobRow.user).where(orm.JobRow.id == job_id))
        if owner is None:
            raise job_not_found(job_id)
        return owner

    def cancel_job(self, job_id: str, *, actor: str = "") -> dict[str, Any]:
        """A queued or granted job ends at once (its lease released); a running one goes
        ``cancelling`` (its runner stops it and reports the exit); an ended one stays."""
        now = self.clock()
        with self.transaction() as (db, alloc):
            job = self._job_row(db, job_id)
            if job.state in ("queued", "granted"):
                why = "cancelled" if job.state == "queued" else "stopped"
                job.state, job.ended = "cancelled", now
                job.reason = f"cancelled by {actor or job.user}"
                self._end_lease(db, alloc, job, why)
                self._job_event(db, "job-cancelled", actor, job)
            elif job.state in ("running", "preempting"):
                job.state = "cancelling"
                self._job_event(db, "job-cancelling", actor, job)
            return self._job_json(db, alloc, job)

    def job_log(self, job_id: str, offset: int = 0) -> dict[str, Any]:
        """The job's output from ``offset`` (an offset before what is kept starts at the
        oldest kept character)."""
        with self.read() as db:
            job = self._job_row(db, job_id)
            end = job.log_start + len(job.log)
            start = min(max(offset, job.log_start), end)
            return {
                "offset": start,
                "data": job.log[start - job.log_start :],
                "next": end,
                "complete": job.state in orm.JOB_FINAL,
            }

    # -- the runner's side -------------------------------------------------------------------

    def node_jobs(self, node: str) -> list[dict[str, Any]]:
        """The jobs on ``node`` its runner acts on: to start, cancel or preempt."""
        with self.locked() as alloc, self.read() as db:
            rows = db.scalars(
                select(orm.JobRow)
                .where(
                    orm.JobRow.node == node,
                    orm.JobRow.state.in_(RUNNER_STATES),
                    orm.JobRow.runner.is_(None),  # Kubernetes runs the others
                )
                .order_by(orm.JobRow.created, orm.JobRow.id)
            )
            return [self._job_json(db, alloc, j, with_env=True) for j in rows]

    def job_status(
        self,
        job_id: str,
        state: str,
        exit_code: int | None = None,
        pid: int | None = None,
        *,
        actor: str = "",
    ) -> dict[str, Any]:
        """The runner's report: ``running`` (also its heartbeat) or ``exited`` (the job ends:
        succeeded or failed by its exit code, cancelled or preempted if it was being stopped;
        the lease is released)."""
        if state not in ("running", "exited"):
            raise StoreError(
                "invalid_field",
                f"state must be running or exited, got {state!r}",
                field="state",
                allowed=("running", "exited"),
            )
        now = self.clock()
        with self.transaction() as (db, alloc):
            job = self._job_row(db, job_id)
            if job.state in orm.JOB_FINAL or job.state == "queued":
                raise StoreError(
                    "job_not_running", f"job {job_id} is {job.state}", field="id"
                )  # the runner stops what it still runs of it
            job.runner_seen = now
            if pid is not None:
                job.pid = pid
            if state == "running":
                if job.state == "granted":
                    job.state, job.started = "running", now
                    lease = self._lease_of(db, job)
                    if lease is not None and lease.state == "granted":
                        lease.state, lease.activated, lease.keepalive = "active", now, now
                        self._event(db, "activated", actor, lease)
                    self._job_event(db, "job-running", actor, job, pid=pid)
                return self._job_json(db, alloc, job)
            job.exit_code = exit_code
            job.ended = now
            why = "stopped"
            if job.state == "cancelling":
                job.state = "cancelled"
            elif job.state == "preempting":
                job.state, why = "preempted", "preempted"
            else:
                job.state = "succeeded" if exit_code == 0 else "failed"
                if exit_code != 0:
                    job.reason = f"exit code {exit_code}"
            self._end_lease(db, alloc, job, why)
            self._job_event(db, "job-ended", actor, job, exit_code=exit_code)
            return self._job_json(db, alloc, job)

    def append_job_log(self, job_id: str, offset: int, data: str) -> dict[str, Any]:
        """Add the runner's output at ``offset`` (what is there already is not written
        twice); keeps the last ``LOG_KEEP`` characters. Answers where the next part starts."""
        with self.transaction() as (db, _):
            job = self._job_row(db, job_id)
            end = job.log_start + len(job.log)
            if offset > end:
                raise StoreError(
                    "invalid_field",
                    f"offset {offset} is past the end of the log ({end})",
                    field="offset",
                )
            fresh = data[end - offset :] if offset < end else data
            text = job.log + fresh
            if len(text) > LOG_KEEP:
                job.log_start += len(text) - LOG_KEEP
                text = text[-LOG_KEEP:]
            job.log = text
            return {"next": job.log_start + len(job.log)}

    # -- preemption and the runner timeout ---------------------------------------------------

    def preempt_jobs(self, *, actor: str = "") -> list[str]:
        """Give preemptible jobs whose leases a waiting request within guarantee needs their
        notice (``preempting``, deadline = now + the class's grace; audited), and those a long
        waiter of a class with ``preempt_for_waiters`` needs on the node held for it
        (``workloads.waiter_preemption_rank``: smaller borrowed ones). Waiters are
        served in queue order; leases already leaving count first, so no waiter takes two
        rounds' notices. Returns the jobs noticed now."""
        now = self.clock()
        noticed: list[str] = []
        if not self._may_preempt():
            return noticed  # no write (no version bump other processes would catch up with)
        with self.transaction() as (db, alloc):
            noticed += self._follow_lease_notices(db, alloc, actor)
            jobs = {
                j.lease_id: j
                for j in db.scalars(select(orm.JobRow).where(orm.JobRow.state.in_(ALIVE_STATES)))
                if j.lease_id
            }
            if not jobs:
                return noticed
            workloads = dict(
                db.execute(
                    select(orm.LeaseRow.id, orm.LeaseRow.workload).where(
                        orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)),
                        orm.LeaseRow.workload.is_not(None),
                    )
                ).all()
            )
            promised: set[str] = set()
            holds = alloc.holds(self._now_s())  # the node each long waiter holds
            for waiter in alloc.queue(self._now_s()):
                if waiter.reason == "quota" or waiter.request.id not in alloc.waiters:
                    continue  # no preemption ends a wait for quota; or served meanwhile
                requester = lease_class(self.classes, workloads.get(waiter.request.id))
                node = None
                if requester.preemptible:  # only a long waiter, on the node held for it
                    if not requester.preempt_for_waiters:
                        continue
                    node = holds.get(waiter.request.id)
                    if node is None:
                        continue
                units = waiter.units if node is not None else None
                rank = self._ranker(alloc, jobs, workloads, promised, requester, units)
                victims = alloc.reclaimable_for(waiter.request, self._now_s(), rank, node)
                fresh = [
                    jobs[v]
                    for v in victims
                    if v in jobs and jobs[v].state in ("granted", "running")
                ]
                promised |= set(victims)
                for job in fresh:
                    cls = lease_class(self.classes, job.workload)
                    job.reason = preempting_reason(
                        waiter.request.user, waiter.request.offer, long_waiter=node is not None
                    )
                    if job.state == "granted":  # never started: nothing to stop
                        job.state, job.ended = "preempted", now
                        self._end_lease(db, alloc, job, "preempted")
                        self._job_event(db, "job-ended", actor, job, for_request=waiter.request.id)
                        noticed.append(job.id)
                        continue
                    job.state = "preempting"
                    job.notice_deadline = now + timedelta(seconds=cls.grace)
                    self._job_event(
                        db,
                        "job-preempting",
                        actor,
                        job,
                        deadline=ts(job.notice_deadline),
                        for_request=waiter.request.id,
                    )
                    noticed.append(job.id)
        return noticed

    def _follow_lease_notices(self, db: Session, alloc: Allocator, actor: str) -> list[str]:
        """A job whose lease got an enforced notice (``reclaiming``: an administrator's, a
        drain's, a spent budget's; of any class, the admin decided) is stopped by its runner
        like a preempted one, by the notice's deadline; one that never started ends at once.
        The hub has no server of it to stop (``OperateStore.enforce_notices`` leaves it)."""
        rows = db.execute(
            select(orm.JobRow, orm.LeaseRow)
            .join(orm.LeaseRow, orm.LeaseRow.id == orm.JobRow.lease_id)
            .where(orm.JobRow.state.in_(("granted", "running")), orm.LeaseRow.state == "reclaiming")
        ).all()
        now, out = self.clock(), []
        for job, lease in rows:
            job.reason = lease.reclaim_reason or f"{lease.reclaim_kind} notice"
            if job.state == "granted":
                job.state, job.ended = "preempted", now
                self._end_lease(db, alloc, job, "admin")
                self._job_event(db, "job-ended", actor, job)
            else:
                job.state, job.notice_deadline = "preempting", lease.reclaim_deadline or now
                self._job_event(db, "job-preempting", actor, job, notice=lease.reclaim_kind)
            out.append(job.id)
        return out

    def _may_preempt(self) -> bool:
        """Whether a round could do anything: a job's lease under an administrator's notice,
        or a request waiting while a job of a preemptible class runs (most rounds of most
        pools: neither)."""
        preemptible = [c.name for c in self.classes.values() if c.preemptible]
        with self.read() as db:
            noticed = db.scalar(
                select(orm.LeaseRow.id)
                .where(orm.LeaseRow.holder == JOB_HOLDER, orm.LeaseRow.state == "reclaiming")
                .limit(1)
            )
            if noticed is not None:
                return True
        with self.locked() as alloc:
            if not any(w.reason != "quota" for w in alloc.waiters.values()):
                return False
        with self.read() as db:
            return (
                db.scalar(
                    select(orm.JobRow.id)
                    .where(
                        orm.JobRow.state.in_(ALIVE_STATES),
                        orm.JobRow.workload.in_(preemptible),
                    )
                    .limit(1)
                )
                is not None
            )

    def _ranker(
        self,
        alloc: Allocator,
        jobs: Mapping[str, orm.JobRow],
        workloads: Mapping[str, str | None],
        promised: set[str],
        requester: WorkloadClass,
        units: Fraction | None = None,
    ) -> Any:
        """The leases ``requester``'s waiter may take, in order: ``workloads.preemption_rank``,
        or for a long waiter of ``units`` on its held node ``waiter_preemption_rank``."""
        q = alloc.quotas
        now = self._now_s()

        def rank(lease: Lease) -> Any:
            if lease.id in promised:  # already promised to a waiter ahead in the queue
                return None
            job = jobs.get(lease.id)
            holder = Holder(
                lease.id,
                lease_class(self.classes, workloads.get(lease.id)),
                lease.borrowed,
                lease.request.arrival,
                owner_surplus(lease.request.user, lease.group, q.held_user, q.held_group, q)
                if lease.borrowed
                else Fraction(0),
                leaving=job is not None and job.state in ("preempting", "cancelling"),
                units=lease.units,
            )
            if units is not None:
                return waiter_preemption_rank(holder, requester, units, now)
            return preemption_rank(holder, requester, now)

        return rank

    def reconcile(
        self,
        running: set[tuple[str, str]],
        *,
        actor: str = "system",
        reason: str = "stopped",
        older_than: datetime | None = None,
        deleted: Iterable[tuple[str, str]] = (),
    ) -> int:
        """Release leases (``reason``) and end queue entries (``cancelled``) nothing holds any
        more (``pool.holders.orphans``): a server's the hub no longer runs or spawns, a job's
        whose job ended; withdraw requests awaiting approval for the ``deleted`` servers (user,
        server) the hub no longer has at all (a server that is only stopped keeps its request:
        it starts on the lease once approved). A kernel's lease is the kernel reaper's. With
        ``older_than``, only those made before it: a request the spawner just made may come
        before the hub lists its server as spawning. Then the runner timeout: a job whose runner
        has not reported for ``job_runner_timeout`` (since its grant, if it never did) fails
        (``runner_lost``) and its lease is released. Returns how many leases were released,
        withdrawn ones included.

        Only the pool's own hub's leases (``hub`` None): ``running`` is what that hub lists,
        which says nothing of another hub's servers (that hub's spawner releases its leases
        when it stops them; an unbound grant expires)."""
        deleted = set(deleted)
        command = c.Reconcile(running, reason, older_than, deleted, actor=actor)
        with self.transaction() as (db, alloc):
            states = ("queued", *orm.LIVE_STATES, *(("awaiting_approval",) if deleted else ()))
            query = (
                select(orm.LeaseRow)
                .where(orm.LeaseRow.state.in_(states), orm.LeaseRow.hub.is_(None))
                .order_by(orm.LeaseRow.created, orm.LeaseRow.id)  # the audit log's order
            )
            if older_than is not None:
                query = query.where(orm.LeaseRow.created < older_than)
            rows = db.scalars(query).all()
            jobs_alive = frozenset(
                (u, job_server(i))
                for u, i in db.execute(
                    select(orm.JobRow.user, orm.JobRow.id).where(
                        orm.JobRow.state.in_(("queued", *ALIVE_STATES))
                    )
                ).all()
            )
            facts = LazyFacts(self, db, alloc, rows)
            held = tuple(Held(r.id, r.user, r.server, r.state, r.holder) for r in rows)
            state = PoolState(alloc, facts, held=held, jobs_alive=jobs_alive)
            outcome = decided(state, command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, facts.read)
            self._event(db, "reconciled", actor, data={"released": outcome.answer})
            return int(outcome.answer) + self._runners_lost(db, alloc, actor)

    def _runners_lost(self, db: Session, alloc: Allocator, actor: str) -> int:
        now = self.clock()
        lost = 0
        alive = select(orm.JobRow).where(
            orm.JobRow.state.in_(ALIVE_STATES),
            orm.JobRow.runner.is_(None),  # Kubernetes' jobs live as long as their Workload
        )
        for job in db.scalars(alive):
            lease = self._lease_of(db, job)
            last = job.runner_seen or (lease.granted if lease is not None else None) or job.created
            last = max(last, self._runners_watched_from)
            deadline = job.notice_deadline if job.state == "preempting" else None
            silent = runner_silent(
                epoch(last),
                None if deadline is None else epoch(deadline),
                epoch(now),
                self.job_runner_timeout,
            )
            if not silent:
                continue
            job.state, job.ended, job.reason = "failed", now, "runner_lost"
            self._end_lease(db, alloc, job, "orphaned")
            self._job_event(db, "job-runner-lost", actor, job)
            lost += 1
        return lost

    # -- helpers -----------------------------------------------------------------------------

    def _job_row(self, db: Session, job_id: str) -> orm.JobRow:
        job = db.get(orm.JobRow, job_id)
        if job is None:
            raise job_not_found(job_id)
        return job

    def _end_lease(self, db: Session, alloc: Allocator, job: orm.JobRow, reason: str) -> None:
        lease = self._lease_of(db, job)
        if lease is not None and lease.state != "released":
            self._finish(db, alloc, lease, reason, "system")

    def _job_json(
        self,
        db: Session,
        alloc: Allocator | None,
        job: orm.JobRow,
        lease: orm.LeaseRow | None = None,
        *,
        with_env: bool = False,
    ) -> dict[str, Any]:
        lease = lease or self._lease_of(db, job)
        position = None
        if lease is not None and lease.state == "queued" and alloc is not None:
            position = alloc.position(lease.id, self._now_s())
        devices = job.devices
        if lease is not None and lease.state in orm.LIVE_STATES:
            devices = self._job_devices(alloc, lease)
        out: dict[str, Any] = {
            "id": job.id,
            "user": job.user,
            "group": job.group,
            "name": job.name,
            "offer": job.offer,
            "class": job.workload,
            "replicas": lease.replicas if lease is not None else 1,
            "command": list(job.command),
            "cwd": job.cwd,
            "state": job.state,
            "position": position,
            "lease_id": job.lease_id,
            "node": job.node,
            "devices": devices,
            "created": ts(job.created),
            "started": ts(job.started),
            "ended": ts(job.ended),
            "exit_code": job.exit_code,
            "notice_deadline": ts(job.notice_deadline),
            "reason": job.reason,
            "runner": job.runner or "local",
            "runner_ref": dict(job.runner_ref) if job.runner_ref else None,
        }
        if with_env:
            out["env"] = dict(job.env or {})
        return out

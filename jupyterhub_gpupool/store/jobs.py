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
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from .. import orm
from ..pool import commands as c
from ..pool.allocator import Allocator
from ..pool.facts import JobFacts, PoolState
from ..pool.headroom import deficits
from ..pool.holders import Held, job_server, runner_silent
from ..pool.rules.jobs import ALIVE_STATES, KUEUE
from ..pool.rules.jobs import job_not_found as refused_job
from ..pool.workloads import JOB_HOLDER, WorkloadClass
from .apply import LazyFacts, decided
from .errors import StoreError
from .leases import LeaseStore
from .read.jobs import JobLogAppended, JobLogView, JobView, job_log_view, job_view
from .rows import epoch

__all__ = ["ALIVE_STATES", "LOG_KEEP", "RUNNER_STATES", "JobStore", "job_facts", "job_not_found"]

#: The most of a job's output the pool keeps (the last characters).
LOG_KEEP = 1024 * 1024
#: States the runner acts on (its node's list).
RUNNER_STATES = ("granted", "cancelling", "preempting")


def job_not_found(job_id: str) -> StoreError:
    """The refusal for a job that does not exist (or is not the caller's)."""
    e = refused_job(job_id)
    return StoreError(e.code, e.message, field=e.field)


def job_facts(job: orm.JobRow, lease: orm.LeaseRow | None = None) -> JobFacts:
    """What the pool's rules read of a job's row (and of ``lease``'s enforced notice)."""
    ref = job.runner_ref or {}
    notice = lease is not None and lease.state == "reclaiming"
    return JobFacts(
        job.id,
        job.user,
        job.state,
        job.lease_id,
        job.workload,
        uid=ref.get("uid"),
        reason=job.reason,
        lease_reclaiming=notice,
        notice_kind=lease.reclaim_kind if lease is not None and notice else None,
        notice_reason=lease.reclaim_reason if lease is not None and notice else None,
        notice_deadline=epoch(lease.reclaim_deadline)
        if lease is not None and notice and lease.reclaim_deadline is not None
        else None,
    )


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
    ) -> JobView:
        """Ask for ``offer`` for a job of class ``workload``: its lease is granted or queued
        like a server's; refusals are the allocation's, plus ``unknown_class``,
        ``class_not_allowed``, ``invalid_command``, ``invalid_env``, ``invalid_image`` and
        ``invalid_replicas``. With ``image``, Kubernetes runs it (``kube.kubejobs.KubeJobs``),
        not the local runner. ``replicas`` copies of the offer are one grant, on one node, and
        count against the user's and group's quota (``workloads.check_replicas``)."""
        command_ = c.SubmitJob(
            user, offer, command, workload, name, group, tuple(groups), env, cwd, image,
            replicas, actor=actor,
        )  # fmt: skip
        return self._new_job(command_, actor)

    def _new_job(self, command: c.SubmitJob | c.KueueJob, actor: str) -> JobView:
        """A job's row and its lease (granted or queued): ``pool.decide`` decides, on the
        facts an ask reads (``_ask_state``) and the workload classes; ``actor`` audits."""
        job_id = uuid.uuid4().hex
        with self.transaction() as (db, alloc):
            state = self._ask_state(
                db, alloc, command.user, job_server(job_id), classes=self.classes,
                new_job_id=job_id, jobs=self._kueue_jobs(db, command),
            )  # fmt: skip
            outcome = decided(state, command, self._now_s())
            made = self._apply_effects(db, alloc, outcome.effects, actor)
            job = self._job_row(db, outcome.answer)
            return self._job_view(db, alloc, job, made.get(job.lease_id or ""))

    def _kueue_jobs(self, db: Session, command: c.Command) -> tuple[JobFacts, ...]:
        """A Kueue Workload's jobs (by its name, newest first; none for another command)."""
        if not isinstance(command, c.KueueJob):
            return ()
        rows = db.scalars(
            select(orm.JobRow)
            .where(
                orm.JobRow.runner == KUEUE,
                orm.JobRow.name == f"{command.namespace}/{command.name}",
            )
            .order_by(orm.JobRow.created.desc())
        )
        return tuple(job_facts(j) for j in rows)

    def list_jobs(self, user: str | None = None, state: str | None = None) -> list[JobView]:
        """Jobs, newest first (``user`` None: everybody's)."""
        with self.locked() as alloc, self.read() as db:
            q = select(orm.JobRow)
            if user is not None:
                q = q.where(orm.JobRow.user == user)
            if state is not None:
                q = q.where(orm.JobRow.state == state)
            rows = db.scalars(q.order_by(orm.JobRow.created.desc(), orm.JobRow.id).limit(1000))
            return [self._job_view(db, alloc, j) for j in rows]

    def job(self, job_id: str) -> JobView:
        """One job, or ``not_found``."""
        with self.locked() as alloc, self.read() as db:
            return self._job_view(db, alloc, self._job_row(db, job_id))

    def job_owner(self, job_id: str) -> str:
        """Whose job it is (``not_found`` if none)."""
        with self.read() as db:
            owner = db.scalar(select(orm.JobRow.user).where(orm.JobRow.id == job_id))
        if owner is None:
            raise job_not_found(job_id)
        return owner

    def cancel_job(self, job_id: str, *, actor: str = "") -> JobView:
        """A queued or granted job ends at once (its lease released); a running one goes
        ``cancelling`` (its runner stops it and reports the exit); an ended one stays.
        ``pool.decide`` decides."""
        return self._job_command(c.CancelJob(job_id, actor=actor), actor)

    def _job_command(
        self, command: c.CancelJob | c.JobStatus | c.EndKubeJob, actor: str
    ) -> JobView:
        """Decide a command on one job (with its lease's facts) and apply it; answers the
        job."""
        with self.transaction() as (db, alloc):
            job = db.get(orm.JobRow, command.job_id)
            lease = self._lease_of(db, job) if job is not None else None
            facts, rows = self._lease_facts(db, alloc, [lease]) if lease is not None else ({}, {})
            fact = job_facts(job) if job is not None else None
            state = PoolState(alloc, facts, job=fact)
            outcome = decided(state, command, self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, rows)
            assert job is not None  # else refused
            return self._job_view(db, alloc, job)

    def job_log(self, job_id: str, offset: int = 0) -> JobLogView:
        """The job's output from ``offset`` (an offset before what is kept starts at the
        oldest kept character)."""
        with self.read() as db:
            return job_log_view(self._job_row(db, job_id), offset)

    # -- the runner's side -------------------------------------------------------------------

    def node_jobs(self, node: str) -> list[JobView]:
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
            return [self._job_view(db, alloc, j, with_env=True) for j in rows]

    def job_status(
        self,
        job_id: str,
        state: str,
        exit_code: int | None = None,
        pid: int | None = None,
        *,
        actor: str = "",
    ) -> JobView:
        """The runner's report: ``running`` (also its heartbeat) or ``exited`` (the job ends:
        succeeded or failed by its exit code, cancelled or preempted if it was being stopped;
        the lease is released)."""
        return self._job_command(c.JobStatus(job_id, state, exit_code, pid, actor=actor), actor)

    def append_job_log(self, job_id: str, offset: int, data: str) -> JobLogAppended:
        """Add the runner's output at ``offset`` (what is there already is not written
        twice); keeps the last ``LOG_KEEP`` characters. Answers where the next part starts.
        Not ``pool.decide``'s: the output changes no pool state (no lease, no job's state),
        so it is a plain record of the job's row."""
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
            return JobLogAppended(job.log_start + len(job.log))

    # -- preemption and the runner timeout ---------------------------------------------------

    def preempt_jobs(self, *, actor: str = "") -> list[str]:
        """Give preemptible jobs whose leases a waiting request within guarantee needs their
        notice (``preempting``, deadline = now + the class's grace; audited), and those a long
        waiter of a class with ``preempt_for_waiters`` needs on the node held for it
        (``workloads.waiter_preemption_rank``: smaller borrowed ones); first, a job whose
        lease got an enforced notice follows it. ``pool.decide`` decides
        (``rules.jobs``); returns the jobs noticed now."""
        if not self._may_preempt():
            return []  # no write (no version bump other processes would catch up with)
        with self.transaction() as (db, alloc):
            found = db.execute(
                select(orm.JobRow, orm.LeaseRow)
                .join(orm.LeaseRow, orm.LeaseRow.id == orm.JobRow.lease_id)
                .where(orm.JobRow.state.in_(ALIVE_STATES))
                .order_by(orm.JobRow.created, orm.JobRow.id)
            ).all()
            workloads = dict(
                db.execute(
                    select(orm.LeaseRow.id, orm.LeaseRow.workload).where(
                        orm.LeaseRow.state.in_(("queued", *orm.LIVE_STATES)),
                        orm.LeaseRow.workload.is_not(None),
                    )
                ).all()
            )
            facts = LazyFacts(self, db, alloc, [lease for _, lease in found])
            jobs = tuple(job_facts(job, lease) for job, lease in found)
            state = PoolState(alloc, facts, classes=self.classes, jobs=jobs, workloads=workloads)
            outcome = decided(state, c.PreemptJobs(actor=actor), self._now_s())
            self._apply_effects(db, alloc, outcome.effects, actor, facts.read)
            return list(outcome.answer)

    def _may_preempt(self) -> bool:
        """Whether a round could do anything: a job's lease under an administrator's notice,
        or a request waiting, or a GPU model short of its headroom (``pool.headroom``), while a
        job of a preemptible class runs (most rounds of most pools: neither)."""
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
            short = alloc.headroom is not None and bool(
                deficits(alloc.headroom, alloc.headroom_free(self._now_s())[0], {})
            )
            if not short and not any(w.reason != "quota" for w in alloc.waiters.values()):
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

    def _job_view(
        self,
        db: Session,
        alloc: Allocator | None,
        job: orm.JobRow,
        lease: orm.LeaseRow | None = None,
        *,
        with_env: bool = False,
    ) -> JobView:
        """``read.jobs.job_view`` of ``job`` with its lease (``lease``: read already)."""
        lease = lease or self._lease_of(db, job)
        return job_view(job, lease, alloc, self._now_s(), with_env=with_env)

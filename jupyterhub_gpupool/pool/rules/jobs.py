"""Jobs: a submission (its lease asked like a server's, ``rules.leases.allocate``), a
Kueue Workload's job, a cancel, the runner's and Kubernetes' reports, and preemption by the
workload classes' rules (``pool.workloads``: a preemptible job makes way for a request
within guarantee with its class's grace; a long waiter of a class with
``preempt_for_waiters`` takes smaller borrowed preemptible leases on the node held for it;
with a headroom, borrowed preemptible jobs make the GPUs it keeps free again:
``pool.headroom``).

A job that ends takes its lease along (``JobEnded`` carries that end's effects, the rule
every caller that ends a lease follows: ``pool.ending``). ``AppendJobLog`` is not here: the
runner's output changes no pool state (no lease, no job state), so it stays a plain record
the store writes (``JobStore.append_job_log``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace
from fractions import Fraction
from typing import Any

from .. import commands as c
from ..allocator import Allocator
from ..borrowing import owner_surplus
from ..decisions import Lease
from ..effects import (
    Effect,
    JobCancelling,
    JobEnded,
    JobPreempting,
    JobSeen,
    JobStarted,
    JobSubmitted,
    KeptAlive,
    LeaseActivated,
    NewJob,
    NodeHeld,
    WaitReason,
)
from ..ending import finish_in, finishing
from ..errors import PoolError, Refusal
from ..facts import JobFacts, LeaseFacts, Outcome, PoolState, Rule
from ..headroom import HEADROOM, Borrower, hold_changes, refill, refill_reason
from ..holders import JOB_FINAL, job_server
from ..model import offer_priority
from ..trial import Trial
from ..workloads import (
    Holder,
    Rank,
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
from .leases import allocate

#: The runner of a Kueue Workload's job (``JobRow.runner``).
KUEUE = "kueue"
#: How a Kubernetes-run job's Workload ended, as the controller reports it.
KUBE_OUTCOMES = ("succeeded", "failed", "deleted", "evicted")
#: Job states in which the runner has (or may have) a process: its reports count.
ALIVE_STATES = ("granted", "running", "cancelling", "preempting")
#: Job states a runner's report is taken in (``running`` or ``exited``).
REPORTS = ("running", "exited")


def refused(e: PoolError) -> Refusal:
    """A check's ``PoolError`` as the refusal of the command (its message as it was: it
    says what is allowed already)."""
    refusal = Refusal(e.code, e.message, field=e.field)
    refusal.allowed = e.allowed
    return refusal


def job_not_found(job_id: str) -> Refusal:
    """The refusal for a job that does not exist (or is not the caller's)."""
    return Refusal("not_found", f"no job {job_id!r}", field="id")


def _submit(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A job of class ``cmd.workload``: its lease granted or queued like a server's."""
    try:
        command, env = check_job(cmd.command, cmd.env)
        cwd = check_cwd(cmd.cwd)
    except PoolError as e:
        raise refused(e) from None
    runner, ref = None, None
    image = cmd.image
    if image is not None:
        # an image reference is printable ASCII without spaces (the spec's pattern)
        if not image or len(image) > 512 or not all("!" <= ch <= "~" for ch in image):
            raise Refusal("invalid_image", f"not a container image: {image!r}", field="image")
        runner, ref = "kubernetes", {"image": image}
    return new_job(
        state, cmd.user, cmd.offer, command, cmd.workload, cmd.name, cmd.group, cmd.groups,
        env, cwd, cmd.actor, now, runner, ref, cmd.replicas,
    )  # fmt: skip


def new_job(
    state: PoolState,
    user: str,
    offer: str,
    command: list[str],
    workload: str,
    name: str,
    group: str | None,
    groups: Iterable[str],
    env: Mapping[str, str] | None,
    cwd: str | None,
    actor: str,
    now: float,
    runner: str | None = None,
    runner_ref: Mapping[str, str] | None = None,
    replicas: object = 1,
) -> Outcome:
    """A job's lease asked (its class's priority; ``replicas`` copies of the offer in one
    grant) and its row; answers the job's id (``state.new_job_id``)."""
    groups = tuple(groups)
    alloc, job_id = state.alloc, state.new_job_id
    try:
        cls = class_for(state.classes, workload, groups)
        copies = check_replicas(replicas, cls, alloc.offers.get(offer))
    except PoolError as e:
        raise refused(e) from None
    prio = request_priority(state.classes, cls, offer_priority(alloc.offers.get(offer)))
    ask = c.Allocate(
        user, job_server(job_id), offer, group=group, groups=groups, priority=prio,
        replicas=copies, actor=actor,
    )  # fmt: skip
    asked = allocate(state, ask, now, cls.name)
    job = NewJob(
        job_id,
        user,
        # the program's name by default (as long as the column holds)
        (name or f"{command[0].rsplit('/', 1)[-1][:200]}-{job_id[:6]}")[:255],
        offer,
        cls.name,
        tuple(command),
        env,
        cwd,
        runner,
        runner_ref,
    )
    return Outcome(job_id, (*asked.effects, JobSubmitted(asked.answer, job)))


def kueue_job_of(jobs: Iterable[JobFacts], uid: str) -> str | None:
    """The job a Workload ``uid`` has (of ``jobs``, its name's, newest first): its live one,
    or the one a user cancelled in the pool (the controller rejects the Workload)."""
    for job in jobs:
        if job.uid != uid:
            continue
        live = job.state in ("queued", *ALIVE_STATES)
        if live or (job.state == "cancelled" and (job.reason or "").startswith("cancel")):
            return job.id
    return None


def _kueue_job(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The Workload's job (``kueue_job_of``), else a new one asking for ``cmd.offer``: one
    lease per Workload however many rounds see it waiting."""
    found = kueue_job_of(state.jobs, cmd.uid)
    if found is not None:
        return Outcome(found)
    ref = {"namespace": cmd.namespace, "name": cmd.name, "uid": cmd.uid}
    return new_job(
        state, cmd.user, cmd.offer, [], cmd.workload, f"{cmd.namespace}/{cmd.name}", None, (),
        None, None, cmd.actor or f"kueue:{cmd.namespace}", now, KUEUE, ref,
    )  # fmt: skip


def _the_job(state: PoolState, job_id: str) -> JobFacts:
    if state.job is None:
        raise job_not_found(job_id)
    return state.job


def lease_end(state: PoolState, job: JobFacts, reason: str, now: float) -> tuple[Effect, ...]:
    """The end of ``job``'s lease for ``reason`` (nothing if it has ended already)."""
    facts = state.leases.get(job.lease_id) if job.lease_id else None
    if facts is None or facts.state == "released":
        return ()
    return finishing(state, [(facts, reason)], now)


def _cancel(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A queued or granted job ends at once (its lease released); a running one goes
    ``cancelling`` (its runner stops it and reports the exit); an ended one stays."""
    job = _the_job(state, cmd.job_id)
    if job.state in ("queued", "granted"):
        why = "cancelled" if job.state == "queued" else "stopped"
        reason = f"cancelled by {cmd.actor or job.user}"
        end = lease_end(state, job, why, now)
        return Outcome(
            job.id, (JobEnded(job.id, "cancelled", reason, lease=end, event="job-cancelled"),)
        )
    if job.state in ("running", "preempting"):
        return Outcome(job.id, (JobCancelling(job.id),))
    return Outcome(job.id)


def _status(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The runner's report: ``running`` (its heartbeat; a granted job starts, its lease is
    bound) or ``exited`` (the job ends: succeeded or failed by its exit code, cancelled or
    preempted if it was being stopped; its lease is released)."""
    if cmd.state not in REPORTS:
        raise Refusal(
            "invalid_field",
            f"state must be running or exited, got {cmd.state!r}",
            field="state",
            allowed=REPORTS,
        )
    job = _the_job(state, cmd.job_id)
    if job.state in JOB_FINAL or job.state == "queued":
        # the runner stops what it still runs of it
        raise Refusal("job_not_running", f"job {job.id} is {job.state}", field="id")
    effects: list[Effect] = [JobSeen(job.id, cmd.pid)]
    if cmd.state == "running":
        if job.state == "granted":
            lease = state.leases.get(job.lease_id) if job.lease_id else None
            if lease is not None and lease.state == "granted":
                effects += [KeptAlive(lease.id), LeaseActivated(lease.id)]
            effects.append(JobStarted(job.id, cmd.pid))
        return Outcome(job.id, tuple(effects))
    why, reason = "stopped", None
    if job.state == "cancelling":
        ends = "cancelled"
    elif job.state == "preempting":
        ends, why = "preempted", "preempted"
    else:
        ends = "succeeded" if cmd.exit_code == 0 else "failed"
        if cmd.exit_code != 0:
            reason = f"exit code {cmd.exit_code}"
    end = lease_end(state, job, why, now)
    data = (("exit_code", cmd.exit_code),)
    effects.append(JobEnded(job.id, ends, reason, cmd.exit_code, end, data=data))
    return Outcome(job.id, tuple(effects))


def _end_kube_job(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The Workload ``succeeded`` or ``failed``, was ``deleted``, or was ``evicted`` (after the
    pool's ``Retry`` of a preempting job: ``preempted``; by Kueue itself: ``cancelled``). The
    job ends and its lease is released; an ended job stays as it is."""
    outcome = cmd.outcome
    if outcome not in KUBE_OUTCOMES:
        raise Refusal(
            "invalid_field",
            f"outcome must be one of {', '.join(KUBE_OUTCOMES)}, got {outcome!r}",
            field="outcome",
            allowed=KUBE_OUTCOMES,
        )
    job, message = _the_job(state, cmd.job_id), cmd.message
    if job.state in JOB_FINAL:
        return Outcome(job.id)
    why = "cancelled" if job.state == "queued" else "stopped"
    if job.state == "cancelling":  # the pool's cancel, carried out by Kueue
        ends, message = "cancelled", "cancelled in the pool"
    elif outcome == "evicted" and job.state == "preempting":
        ends, why = "preempted", "preempted"
    elif outcome in ("deleted", "evicted"):
        ends = "cancelled"
    else:
        ends = outcome
    reason = None
    if ends != "preempted" and (message or outcome != "succeeded"):
        reason = message or f"workload {outcome}"
    end = lease_end(state, job, why, now)
    return Outcome(
        job.id, (JobEnded(job.id, ends, reason, lease=end, data=(("outcome", outcome),)),)
    )


def _preempt(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A round of preemption; answers the jobs noticed (or ended) now.

    First the jobs whose lease got an enforced notice (an administrator's, a drain's, a
    spent budget's; of any class: the admin decided) follow it: a running one is stopped by
    its runner by the notice's deadline, one that never started ends at once. Then each
    waiter in queue order (none waiting for quota) takes what ``workloads.preemption_rank``
    allows it within guarantee, or, a long waiter of a class with ``preempt_for_waiters``,
    what ``workloads.waiter_preemption_rank`` allows it on the node held for it: a running
    job gets its notice with its class's grace, a granted one ends at once. The ends are
    played as they go (a trial), so a later waiter sees what an earlier one freed; leases
    already leaving count first and none is promised to two waiters. Last, with a headroom
    (``pool.headroom``), the refill: borrowed jobs of a preemptible class get their notice
    until each GPU model's free units, with those already leaving for no waiter, are back to
    what it keeps free (:func:`_refill`). It says which node each long waiter now holds
    (``NodeHeld``, where that changed: the hold is sticky, :func:`_holds`)."""
    effects: list[Effect] = []
    noticed: list[str] = []
    alive = {j.lease_id: j for j in state.jobs if j.lease_id is not None}
    ended: list[Lease] = []  # leases ended at once (with nobody waiting, still held in the trial)
    with Trial(state.alloc) as trial:
        for job in state.jobs:
            if not job.lease_reclaiming or job.state not in ("granted", "running"):
                continue
            reason = job.notice_reason or f"{job.notice_kind} notice"
            assert job.lease_id is not None
            if job.state == "granted":
                if job.lease_id in trial.alloc.leases:
                    ended.append(trial.alloc.leases[job.lease_id])
                end = _end_now(trial, state.leases[job.lease_id], "admin", now)
                effects.append(JobEnded(job.id, "preempted", reason, lease=end))
                del alive[job.lease_id]
            else:
                deadline = job.notice_deadline if job.notice_deadline is not None else now
                effects.append(JobPreempting(job.id, deadline, reason, notice=job.notice_kind))
                alive[job.lease_id] = replace(job, state="preempting")
            noticed.append(job.id)
        promised = _for_waiters(state, trial, alive, now, effects, noticed) if alive else set()
        if alive and trial.alloc.headroom is not None:
            _refill(state, trial, alive, promised, ended, now, effects, noticed)
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
        effects += _holds(trial.alloc, now)
    return Outcome(noticed, tuple(effects))


def _holds(alloc: Allocator, now: float) -> list[Effect]:
    """The nodes held for long waiters after the round, where they changed
    (``headroom.hold_changes``): each is kept until its waiter is granted or gone, or can no
    longer be served there (``headroom.kept_hold``)."""
    remembered = {wid: w.hold for wid, w in alloc.waiters.items()}
    return [NodeHeld(wid, node) for wid, node in hold_changes(alloc.holds(now), remembered)]


def _end_now(trial: Trial, facts: LeaseFacts, reason: str, now: float) -> tuple[Effect, ...]:
    """The effects of ending one lease at once in the round's trial (``ending.finish_in``)."""
    end: list[Effect] = []
    finish_in(trial, [(facts, reason)], now, end)
    return tuple(end)


def _still_held(alloc: Allocator, lease: Lease) -> bool:
    """Whether an ended lease's devices are still held in the trial (nobody was waiting)."""
    for s in lease.slots:
        gpu = alloc.gpus[s.gpu]
        if gpu.whole_lease == lease.id or lease.id in gpu.shares:
            return True
        if any(i.lease == lease.id for i in gpu.instances):
            return True
    return False


def _refill(
    state: PoolState,
    trial: Trial,
    alive: dict[str, JobFacts],
    promised: set[str],
    ended: list[Lease],
    now: float,
    effects: list[Effect],
    noticed: list[str],
) -> None:
    """The headroom's refill (``headroom.refill``): the borrowed jobs of a preemptible class
    it names get their notice with their class's grace (a granted one ends at once). Counted
    as free already: the units of jobs leaving (preempting, cancelling) that no waiter was
    promised, and of leases this round ended whose devices the trial still holds; not
    counted, nor noticed, what is on a node held for a long waiter (``Allocator.headroom_free``:
    what is free there is no headroom)."""
    alloc = trial.alloc
    h = alloc.headroom
    assert h is not None

    def model_of(lease: Lease) -> str:
        return alloc.gpus[lease.slots[0].gpu].model.name if lease.slots else ""

    free, held = alloc.headroom_free(now)
    leaving: dict[str, float] = {}
    borrowers: list[Borrower] = []
    for lid, job in alive.items():
        lease = alloc.leases.get(lid)
        if lease is None or lid in promised or lease.node in held:
            continue  # a held node's units are no headroom, freed or not
        if job.state in ("preempting", "cancelling"):
            leaving[model_of(lease)] = leaving.get(model_of(lease), 0.0) + float(lease.units)
        elif job.state in ("granted", "running") and h.held_back(job.workload, lease.borrowed):
            borrowers.append(Borrower(lid, model_of(lease), lease.units, lease.request.arrival))
    for lease in ended:
        if lease.node not in held and _still_held(alloc, lease):
            leaving[model_of(lease)] = leaving.get(model_of(lease), 0.0) + float(lease.units)
    for b in refill(h, free, leaving, borrowers):
        job = alive[b.id]
        reason = refill_reason(b.model, h.keep(b.model))
        if job.state == "granted":  # never started: nothing to stop
            end = _end_now(trial, state.leases[b.id], "preempted", now)
            effects.append(JobEnded(job.id, "preempted", reason, lease=end))
            alive[b.id] = replace(job, state="preempted")
        else:
            grace = lease_class(state.classes, job.workload).grace
            effects.append(JobPreempting(job.id, now + grace, reason, grace=grace, notice=HEADROOM))
            alive[b.id] = replace(job, state="preempting")
        noticed.append(job.id)


def _for_waiters(
    state: PoolState,
    trial: Trial,
    alive: dict[str, JobFacts],
    now: float,
    effects: list[Effect],
    noticed: list[str],
) -> set[str]:
    """Each waiter takes what its class may (``_preempt``); answers the leases promised to
    waiters (the ones they wait for, already leaving or noticed now)."""
    alloc, promised = trial.alloc, set[str]()
    holds = alloc.holds(now)  # the node each long waiter holds
    for waiter in alloc.queue(now):
        wid = waiter.request.id
        if waiter.reason == "quota" or wid not in alloc.waiters:
            continue  # no preemption ends a wait for quota; or served meanwhile
        requester = lease_class(state.classes, state.workloads.get(wid))
        node = None
        if requester.preemptible:  # only a long waiter, on the node held for it
            if not requester.preempt_for_waiters:
                continue
            node = holds.get(wid)
            if node is None:
                continue
        units = waiter.units if node is not None else None
        rank = _ranker(state, alive, promised, requester, now, units)
        victims = alloc.reclaimable_for(waiter.request, now, rank, node)
        fresh = [
            alive[v] for v in victims if v in alive and alive[v].state in ("granted", "running")
        ]
        promised |= set(victims)
        for job in fresh:
            assert job.lease_id is not None
            cls = lease_class(state.classes, job.workload)
            reason = preempting_reason(
                waiter.request.user, waiter.request.offer, long_waiter=node is not None
            )
            if job.state == "granted":  # never started: nothing to stop
                end = _end_now(trial, state.leases[job.lease_id], "preempted", now)
                data = (("for_request", wid),)
                effects.append(JobEnded(job.id, "preempted", reason, lease=end, data=data))
                alive[job.lease_id] = replace(job, state="preempted")
            else:
                deadline = now + cls.grace
                effects.append(
                    JobPreempting(job.id, deadline, reason, for_request=wid, grace=cls.grace)
                )
                alive[job.lease_id] = replace(job, state="preempting")
            noticed.append(job.id)
    return promised


def _ranker(
    state: PoolState,
    alive: Mapping[str, JobFacts],
    promised: set[str],
    requester: WorkloadClass,
    now: float,
    units: Fraction | None = None,
) -> Any:
    """The leases ``requester``'s waiter may take, in order: ``workloads.preemption_rank``,
    or for a long waiter of ``units`` on its held node ``waiter_preemption_rank``."""
    q = state.alloc.quotas

    def rank(lease: Lease) -> Rank | None:
        if lease.id in promised:  # already promised to a waiter ahead in the queue
            return None
        job = alive.get(lease.id)
        holder = Holder(
            lease.id,
            lease_class(state.classes, state.workloads.get(lease.id)),
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


RULES: dict[type[c.Command], Rule] = {
    c.SubmitJob: _submit,
    c.KueueJob: _kueue_job,
    c.CancelJob: _cancel,
    c.JobStatus: _status,
    c.EndKubeJob: _end_kube_job,
    c.PreemptJobs: _preempt,
}

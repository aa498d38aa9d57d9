"""The job commands decided by ``pool.decide`` (``pool/rules/jobs.py``): a submission, a Kueue
Workload's job, a cancel, the runner's and Kubernetes' reports, and preemption by the workload
classes' rules, each checked on its effects or refusal with the allocator left as it was (the
rows the applier writes are ``test_jobs_api.py``'s part)."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.effects import (
    JobCancelling,
    JobEnded,
    JobPreempting,
    JobSeen,
    JobStarted,
    JobSubmitted,
    KeptAlive,
    LeaseActivated,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewJob,
    NewLease,
    NodeHeld,
    apply_effect,
)
from jupyterhub_gpupool.pool.facts import PoolState
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.workloads import DEFAULT_CLASSES, parse_classes
from jupyterhub_gpupool.store.apply import decided as store_decided
from jupyterhub_gpupool.store.errors import StoreError
from tests.allocrig import (
    decided,
    granted,
    h100_node,
    job,
    lease,
    offers,
    pool,
    queued,
    refusal,
    req,
)

CLASSES = DEFAULT_CLASSES
X4 = {"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"]}


def submit(**kw) -> c.SubmitJob:
    return c.SubmitJob(
        kw.pop("user", "u"), kw.pop("offer", "h100"), kw.pop("command", ["train"]), **kw
    )


# -- a submission ------------------------------------------------------------------------------


def test_a_job_is_its_lease_asked_with_its_class_priority_then_its_row():
    out = decided(
        pool(),
        submit(name="run", env={"A": "1"}, actor="user:u"),
        classes=CLASSES,
        new_id="L",
        new_job_id="J",
    )
    assert out.answer == "J"
    grant, made = out.effects
    assert isinstance(grant, LeaseGranted) and grant.new == NewLease()
    request = grant.grant.request
    assert (request.id, request.server, request.priority) == ("L", "job:J", -50)
    assert made == JobSubmitted(
        "L", NewJob("J", "u", "run", "h100", "training", ("train",), {"A": "1"})
    )


def test_a_job_without_capacity_is_queued_and_named_after_its_program():
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", server=f"s{i}"), 0))
    out = decided(
        alloc,
        submit(command=["/opt/bin/train.py", "-x"]),
        classes=CLASSES,
        new_id="L",
        new_job_id="abcdef99",
    )
    waits, made = out.effects
    assert isinstance(waits, LeaseQueued) and waits.new == NewLease()
    assert isinstance(made, JobSubmitted) and made.job.name == "train.py-abcdef"


def test_an_image_makes_kubernetes_the_runner():
    out = decided(
        pool(), submit(image="ghcr.io/x/train:1"), classes=CLASSES, new_id="L", new_job_id="J"
    )
    made = out.effects[-1]
    assert isinstance(made, JobSubmitted)
    assert (made.job.runner, made.job.runner_ref) == ("kubernetes", {"image": "ghcr.io/x/train:1"})


def test_a_submission_is_refused_before_it_asks_for_anything():
    alloc = pool()
    state = {"classes": CLASSES, "new_id": "L", "new_job_id": "J"}
    assert refusal(alloc, submit(command=[]), **state).code == "invalid_command"
    assert refusal(alloc, submit(env={"CUDA_VISIBLE_DEVICES": "0"}), **state).code == "invalid_env"
    assert refusal(alloc, submit(cwd="relative"), **state).code == "invalid_field"
    assert refusal(alloc, submit(image="has space"), **state).code == "invalid_image"
    unknown = refusal(alloc, submit(workload="batch"), **state)
    assert (unknown.code, unknown.field) == ("unknown_class", "class")
    assert refusal(alloc, submit(replicas=2), **state).code == "invalid_replicas"
    assert refusal(alloc, submit(offer="nope"), **state).code == "unknown_offer"


# -- a Kueue Workload's job ---------------------------------------------------------------------


def kueue(uid: str = "W1") -> c.KueueJob:
    return c.KueueJob("u", "h100", "training", "ns", "wl", uid)


def test_a_workload_keeps_its_live_job_or_the_one_a_user_cancelled():
    state = {"classes": CLASSES, "new_id": "L", "new_job_id": "J"}
    live = (job("old", "failed", uid="W1"), job("live", "queued", uid="W1"))
    assert decided(pool(), kueue(), jobs=live, **state).effects == ()
    assert decided(pool(), kueue(), jobs=live, **state).answer == "live"
    cancelled = (job("c", "cancelled", uid="W1", reason="cancelled by user:u"),)
    assert decided(pool(), kueue(), jobs=cancelled, **state).answer == "c"


def test_a_workload_without_one_asks_for_a_new_job_kueue_runs():
    state = {"classes": CLASSES, "new_id": "L", "new_job_id": "J"}
    others = (
        job("x", "running", uid="W0"),
        job("y", "cancelled", uid="W1", reason="workload deleted"),
    )
    out = decided(pool(), kueue(), jobs=others, **state)
    assert out.answer == "J"
    made = out.effects[-1]
    assert isinstance(made, JobSubmitted)
    assert (made.job.name, made.job.runner, made.job.command) == ("ns/wl", "kueue", ())
    assert made.job.runner_ref == {"namespace": "ns", "name": "wl", "uid": "W1"}


# -- a cancel, the runner's reports, Kubernetes' outcome -----------------------------------------


def held(alloc: Allocator, lid: str = "l-j") -> None:
    granted(alloc.submit(req(lid, "h100", server="job:j"), 0))


def test_a_granted_job_cancelled_ends_with_its_lease():
    alloc = pool()
    held(alloc)
    facts = {"l-j": lease("l-j", "granted", server="job:j", holder="job")}
    out = decided(alloc, c.CancelJob("j", actor="user:u"), job=job("j", "granted"), leases=facts)
    (ended,) = out.effects
    assert ended == JobEnded(
        "j",
        "cancelled",
        "cancelled by user:u",
        lease=(LeaseReleased("l-j", "stopped", "granted"),),
        event="job-cancelled",
    )


def test_a_queued_job_cancelled_leaves_the_queue_and_a_running_one_is_stopped_by_its_runner():
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", server=f"s{i}"), 0))
    queued(alloc.submit(req("l-j", "h100", server="job:j"), 1))
    facts = {"l-j": lease("l-j", "queued", server="job:j", holder="job")}
    (ended,) = decided(alloc, c.CancelJob("j"), job=job("j", "queued"), leases=facts).effects
    assert isinstance(ended, JobEnded) and ended.reason == "cancelled by u"
    assert ended.lease[0] == LeaseReleased("l-j", "cancelled", "queued")
    for state in ("running", "preempting"):
        assert decided(alloc, c.CancelJob("j"), job=job("j", state)).effects == (
            JobCancelling("j"),
        )
    assert decided(alloc, c.CancelJob("j"), job=job("j", "succeeded")).effects == ()
    assert refusal(alloc, c.CancelJob("j")).code == "not_found"


def test_the_runners_first_report_starts_the_job_and_binds_its_lease():
    alloc = pool()
    held(alloc)
    facts = {"l-j": lease("l-j", "granted", server="job:j", holder="job")}
    out = decided(alloc, c.JobStatus("j", "running", pid=7), job=job("j", "granted"), leases=facts)
    assert out.effects == (
        JobSeen("j", 7),
        KeptAlive("l-j"),
        LeaseActivated("l-j"),
        JobStarted("j", 7),
    )
    again = decided(alloc, c.JobStatus("j", "running"), job=job("j", "running"), leases=facts)
    assert again.effects == (JobSeen("j"),)  # a heartbeat


def test_an_exit_ends_the_job_by_its_code_or_as_what_it_was_being_stopped_for():
    alloc = pool()
    held(alloc)
    facts = {"l-j": lease("l-j", server="job:j", holder="job")}

    def ends(state: str, code: int) -> JobEnded:
        out = decided(alloc, c.JobStatus("j", "exited", code), job=job("j", state), leases=facts)
        seen, ended = out.effects
        assert seen == JobSeen("j") and isinstance(ended, JobEnded)
        return ended

    failed = ends("running", 3)
    assert (failed.state, failed.reason, failed.exit_code) == ("failed", "exit code 3", 3)
    assert failed.lease[0] == LeaseReleased("l-j", "stopped", "active")
    assert ends("running", 0).state == "succeeded" and ends("running", 0).reason is None
    assert ends("cancelling", 1).state == "cancelled"
    preempted = ends("preempting", 1)
    assert preempted.state == "preempted"
    assert preempted.lease[0] == LeaseReleased("l-j", "preempted", "active")


def test_a_report_is_refused_for_a_bad_state_then_a_job_not_running():
    alloc = pool()
    bad = refusal(alloc, c.JobStatus("missing", "paused"))  # before the job is looked for
    assert (bad.code, bad.field, bad.allowed) == ("invalid_field", "state", ["running", "exited"])
    assert refusal(alloc, c.JobStatus("missing", "running")).code == "not_found"
    for state in ("queued", "failed"):
        no = refusal(alloc, c.JobStatus("j", "running"), job=job("j", state))
        assert no.code == "job_not_running"


def test_kubernetes_outcomes_end_the_job_as_what_happened_to_its_workload():
    alloc = pool()
    held(alloc)
    facts = {"l-j": lease("l-j", server="job:j", holder="job")}

    def ends(state: str, outcome: str, message: str = "") -> JobEnded:
        command = c.EndKubeJob("j", outcome, message)
        (ended,) = decided(alloc, command, job=job("j", state), leases=facts).effects
        assert isinstance(ended, JobEnded) and ended.data == (("outcome", outcome),)
        return ended

    evicted = ends("preempting", "evicted")
    assert (evicted.state, evicted.reason) == ("preempted", None)
    assert evicted.lease[0] == LeaseReleased("l-j", "preempted", "active")
    assert (ends("running", "deleted").state, ends("running", "deleted").reason) == (
        "cancelled",
        "workload deleted",
    )
    assert ends("cancelling", "failed").reason == "cancelled in the pool"
    assert ends("running", "succeeded").reason is None
    assert ends("running", "failed", "OOM").reason == "OOM"
    assert decided(alloc, c.EndKubeJob("j", "failed"), job=job("j", "failed")).effects == ()
    assert refusal(alloc, c.EndKubeJob("j", "exploded")).code == "invalid_field"


# -- preemption: the workload classes' rules as effects ------------------------------------------


def borrowed_pool(trainer_guarantee: int = 0) -> Allocator:
    """One node of four H100s, ``nb`` guaranteed one GPU, ``trainer`` ``trainer_guarantee``."""
    quotas = QuotaBook(
        users={
            "nb": QuotaSpec(guarantee=Fraction(1)),
            "trainer": QuotaSpec(guarantee=Fraction(trainer_guarantee)),
        }
    )
    return Allocator([h100_node("h", 4)], offers(X4), quotas, aging_interval=0)


def trainer_leases(alloc: Allocator, workload: str = "training") -> tuple[dict, tuple]:
    """Four 1-GPU jobs of ``trainer``'s (``j0`` oldest), running; their classes and facts."""
    for i in range(4):
        granted(
            alloc.submit(
                req(f"l-j{i}", "h100", "trainer", server=f"job:j{i}", arrival=float(i)), float(i)
            )
        )
    jobs = tuple(job(f"j{i}", user="trainer", workload=workload) for i in range(4))
    return {f"l-j{i}": workload for i in range(4)}, jobs


def notebook_waits(alloc: Allocator) -> None:
    queued(alloc.submit(req("nb-1", "h100", "nb", arrival=5.0), 5))


def test_a_borrowing_training_gets_a_notice_with_its_class_grace_for_a_notebook_in_guarantee():
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc)
    notebook_waits(alloc)
    assert all(alloc.leases[f"l-j{i}"].borrowed for i in range(4))
    out = decided(alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads)
    (notice,) = out.effects  # one GPU is enough: the youngest gives it
    assert notice == JobPreempting(
        "j3",
        100.0 + 300,
        "preempted: nb (within guarantee) waits for h100",
        for_request="nb-1",
        grace=300,
    )
    assert out.answer == ["j3"]
    # the class's own grace, from the pool config
    slow = parse_classes({"training": {"grace": 900}})
    (later,) = decided(
        alloc, c.PreemptJobs(), 100.0, classes=slow, jobs=jobs, workloads=workloads
    ).effects
    assert isinstance(later, JobPreempting) and (later.deadline, later.grace) == (1000.0, 900)


def test_a_job_already_leaving_counts_first_so_no_second_notice_is_given():
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc)
    notebook_waits(alloc)
    leaving = tuple(replace(j, state="preempting") if j.id == "j1" else j for j in jobs)
    assert (
        decided(
            alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=leaving, workloads=workloads
        ).effects
        == ()
    )


def test_a_granted_job_never_started_ends_at_once_and_the_waiter_is_granted_what_it_frees():
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc)
    notebook_waits(alloc)
    jobs = (*jobs[:3], replace(jobs[3], state="granted"))
    facts = {"l-j3": lease("l-j3", "granted", user="trainer", server="job:j3", holder="job")}
    out = decided(
        alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads, leases=facts
    )
    (ended,) = out.effects
    assert isinstance(ended, JobEnded) and ended.state == "preempted"
    assert ended.data == (("for_request", "nb-1"),)
    released, grant, *_ = ended.lease
    assert released == LeaseReleased("l-j3", "preempted", "granted")
    assert isinstance(grant, LeaseGranted) and grant.grant.request.id == "nb-1"
    for effect in out.effects:  # applied, they leave the pool as the rule saw it would be
        apply_effect(alloc, effect, 100.0)
    assert "nb-1" in alloc.leases and "l-j3" not in alloc.leases


def test_inference_and_interactive_within_guarantee_are_never_preempted():
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc, "inference")  # borrowed, but inference
    notebook_waits(alloc)
    assert (
        decided(
            alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads
        ).effects
        == ()
    )
    alloc = borrowed_pool(trainer_guarantee=4)
    workloads, jobs = trainer_leases(alloc, "interactive")  # within its owner's guarantee
    notebook_waits(alloc)
    assert not any(le.borrowed for le in alloc.leases.values())
    assert (
        decided(
            alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads
        ).effects
        == ()
    )


def test_a_training_request_preempts_nothing_and_a_wait_for_quota_nothing():
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc)
    queued(alloc.submit(req("t-1", "h100", "nb", arrival=5.0), 5))
    workloads["t-1"] = "training"  # not a long waiter: a training waits its turn
    assert (
        decided(
            alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads
        ).effects
        == ()
    )
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc)
    notebook_waits(alloc)
    alloc.waiters["nb-1"].reason = "quota"
    assert (
        decided(
            alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads
        ).effects
        == ()
    )


def two_nodes(trainer_guarantee: int = 0) -> tuple[Allocator, dict, tuple]:
    """Nodes ``a`` and ``b`` of four H100s (a long waiter after 100 s): on ``a`` a notebook
    within guarantee and three 1-GPU trainings, on ``b`` three (``t1`` oldest), one GPU free."""
    quotas = QuotaBook(
        users={
            "nb": QuotaSpec(guarantee=Fraction(1)),
            "trainer": QuotaSpec(guarantee=Fraction(trainer_guarantee)),
        }
    )
    alloc = Allocator(
        [h100_node("a", 4), h100_node("b", 4)],
        offers(X4),
        quotas,
        aging_interval=0,
        reserve_after=100,
    )
    ids = ["a0", "a1", "a2", "t1", "t2", "t3"]
    granted(alloc.submit(req("nb", "h100", "nb", arrival=0.0), 0.0))
    for n, rid in enumerate(ids, 1):
        granted(
            alloc.submit(
                req(rid, "h100", "trainer", server=f"job:{rid}", arrival=float(n)), float(n)
            )
        )
    assert sorted(le.id for le in alloc.leases.values() if le.node == "b") == ["t1", "t2", "t3"]
    jobs = tuple(job(rid, lease_id=rid, user="trainer", workload="training") for rid in ids)
    return alloc, {rid: "training" for rid in ids}, jobs


def test_a_long_waiter_preempts_on_its_held_node_only_smaller_borrowed_preemptible_jobs():
    alloc, workloads, jobs = two_nodes()
    queued(alloc.submit(req("pair", "h100x2", "trainer", server="job:pair", arrival=10.0), 10))
    workloads["pair"] = "training"
    assert (
        decided(
            alloc, c.PreemptJobs(), 50.0, classes=CLASSES, jobs=jobs, workloads=workloads
        ).effects
        == ()
    )
    out = decided(alloc, c.PreemptJobs(), 200.0, classes=CLASSES, jobs=jobs, workloads=workloads)
    # on b, the youngest is enough (one GPU is free there); b is remembered as pair's
    notice, held = out.effects
    assert held == NodeHeld("pair", "b")
    assert notice == JobPreempting(
        "t3",
        200.0 + 300,
        "preempted: trainer's larger job has waited long for h100x2 on this node",
        for_request="pair",
        grace=300,
    )
    # a class without the option takes nothing; nor does anyone within its owner's guarantee
    off = parse_classes({"training": {"preempt_for_waiters": False}})
    assert decided(
        alloc, c.PreemptJobs(), 200.0, classes=off, jobs=jobs, workloads=workloads
    ).effects == (NodeHeld("pair", "b"),)
    alloc, workloads, jobs = two_nodes(trainer_guarantee=8)
    queued(alloc.submit(req("pair", "h100x2", "trainer", server="job:pair", arrival=10.0), 10))
    workloads["pair"] = "training"
    assert decided(
        alloc, c.PreemptJobs(), 200.0, classes=CLASSES, jobs=jobs, workloads=workloads
    ).effects == (NodeHeld("pair", "b"),)


def test_a_job_follows_an_enforced_notice_on_its_lease():
    alloc = borrowed_pool()
    workloads, jobs = trainer_leases(alloc, "inference")  # of any class: the admin decided
    notice = {"lease_reclaiming": True, "notice_kind": "admin", "notice_reason": "maintenance"}
    running = replace(jobs[0], **notice, notice_deadline=500.0)
    unstarted = replace(jobs[1], **notice, state="granted")
    facts = {"l-j1": lease("l-j1", "granted", user="trainer", server="job:j1", holder="job")}
    state = {"classes": CLASSES, "workloads": workloads, "leases": facts}
    out = decided(alloc, c.PreemptJobs(), 100.0, jobs=(running, unstarted, *jobs[2:]), **state)
    follows, ends = out.effects
    assert follows == JobPreempting("j0", 500.0, "maintenance", notice="admin")
    assert isinstance(ends, JobEnded) and (ends.state, ends.reason) == ("preempted", "maintenance")
    assert ends.lease == (LeaseReleased("l-j1", "admin", "granted"),)
    assert out.answer == ["j0", "j1"]


def test_a_refusal_says_once_what_is_allowed_in_the_pool_and_in_the_store():
    """The store passes ``decide``'s refusal on as its own, message as it was."""
    command = c.JobStatus("j", "paused")
    said = "state must be running or exited, got 'paused' (allowed: running, exited)"
    assert refusal(pool(), command).message == said
    with pytest.raises(StoreError) as e:
        store_decided(PoolState(pool()), command, 0.0)
    assert (e.value.message, e.value.allowed) == (said, ["running", "exited"])
    unknown = refusal(pool(), submit(workload="batch"), classes=CLASSES, new_id="L", new_job_id="J")
    assert unknown.message.count("(allowed: ") == 1

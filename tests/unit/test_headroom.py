"""The headroom (``pool.headroom``, the pool config's ``borrowing: {keep_free}``): a borrowed
grant of a preemptible class leaves ``keep_free`` GPUs free for work that is never preempted,
and ``PreemptJobs`` refills it with notices when such work used it; the config's checks
(the mixed-pool replay with it: ``test_simulate_mixed_headroom.py``)."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.effects import JobEnded, JobPreempting, LeaseReleased, NodeHeld
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.headroom import (
    HEADROOM,
    Borrower,
    Headroom,
    deficits,
    headroom_for,
    parse_borrowing,
    refill,
    refill_reason,
)
from jupyterhub_gpupool.pool.model import Gpu, Node
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.workloads import (
    DEFAULT_CLASSES,
    INFERENCE,
    TRAINING,
    parse_classes,
)
from jupyterhub_gpupool.poolconfig import parse_pool_config
from jupyterhub_gpupool.wording import wait_text
from tests.allocrig import (
    A100,
    CATALOG,
    decided,
    granted,
    h100_node,
    job,
    kept,
    lease,
    offers,
    queued,
    req,
)

CLASSES = DEFAULT_CLASSES
ANY = {"name": "any", "kind": "gpu", "count": 1, "models": ["H100-80GB", "A100-80GB"]}


def quotas(trainer: int = 0) -> QuotaBook:
    """``nb`` and ``svc`` guaranteed one GPU each, ``trainer`` ``trainer`` GPUs."""
    return QuotaBook(
        users={
            "nb": QuotaSpec(guarantee=Fraction(1)),
            "svc": QuotaSpec(guarantee=Fraction(1)),
            "trainer": QuotaSpec(guarantee=Fraction(trainer)),
        }
    )


def four(headroom: Headroom | None, trainer: int = 0) -> Allocator:
    """One node of four H100s."""
    return Allocator([h100_node("h", 4)], offers(), quotas(trainer), headroom=headroom)


def train(alloc: Allocator, i: int, offer: str = "h100", t: float | None = None):
    """Job ``j{i}``'s lease (``l-j{i}``) of class training asked at ``t`` (default ``i``)."""
    at = float(i) if t is None else t
    request = req(f"l-j{i}", offer, "trainer", server=f"job:j{i}", arrival=at, workload=TRAINING)
    return alloc.submit(request, at)


# -- the config ---------------------------------------------------------------------------------


def test_keep_free_is_whole_gpus_of_every_model_or_per_model():
    assert parse_borrowing(None, CATALOG.names) == Headroom()
    every = parse_borrowing({"keep_free": 2}, CATALOG.names)
    assert (every.keep("H100-80GB"), every.keep("A100-80GB")) == (2, 2)
    named = parse_borrowing({"keep_free": {"H100-80GB": 3}}, CATALOG.names)
    assert (named.keep("H100-80GB"), named.keep("A100-80GB")) == (3, 0)
    # kept from the preemptible classes only; none kept, or none to keep it from: off
    assert headroom_for(every, CLASSES) == Headroom(2, {}, frozenset({TRAINING}))
    assert headroom_for(Headroom(0), CLASSES) is None
    assert (
        headroom_for(parse_borrowing({"keep_free": {"H100-80GB": 0}}, CATALOG.names), CLASSES)
        is None
    )
    nobody = parse_classes({TRAINING: {"preemptible": False}})
    assert headroom_for(every, nobody) is None


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"keep_free": -1}, "borrowing.keep_free"),
        ({"keep_free": True}, "borrowing.keep_free"),
        ({"keep_free": "2"}, "borrowing.keep_free"),
        ({"keep_free": 1.5}, "borrowing.keep_free"),
        ({"keep_free": 10**9}, "borrowing.keep_free"),
        ({"keep_free": {"H100-80GB": -2}}, "borrowing.keep_free.H100-80GB"),
        ({"keep_free": {"H200-999": 1}}, "borrowing.keep_free.H200-999"),
        ({"keep_fre": 1}, "borrowing"),
        ([1], "borrowing"),
    ],
)
def test_a_bad_keep_free_is_refused_naming_its_field(raw, field):
    with pytest.raises(ConfigError) as e:
        parse_pool_config({"borrowing": raw}, CATALOG)
    assert e.value.field == field


def test_an_unknown_model_is_refused_with_the_known_ones():
    with pytest.raises(ConfigError) as e:
        parse_borrowing({"keep_free": {"H200-999": 1}}, CATALOG.names)
    assert e.value.code == "unknown_gpu_model" and "H100-80GB" in (e.value.allowed or [])


def test_the_pool_config_reads_the_section_and_keeps_nothing_without_it():
    assert parse_pool_config({}, CATALOG).borrowing == Headroom()
    config = parse_pool_config({"borrowing": {"keep_free": 1}}, CATALOG)
    assert config.borrowing == Headroom(1)


# -- the grant rule -----------------------------------------------------------------------------


def test_a_borrowed_training_grant_leaves_keep_free_gpus_and_waits_saying_why():
    alloc = four(kept(1))
    for i in range(3):
        assert granted(train(alloc, i)).borrowed
    held = queued(train(alloc, 3))
    assert held.reason == HEADROOM
    assert "1 H100-80GB GPU is kept free" in held.message and "keep_free" in held.message
    assert alloc.waiters["l-j3"].reason == HEADROOM
    # the notebook within its guarantee finds the GPU kept for it
    granted(alloc.submit(req("nb-1", "h100", "nb", server="a"), 5))
    assert wait_text(HEADROOM, held.message, "1× H100").startswith(
        "waiting: the free 1× H100 is kept for notebooks and services"
    )


def test_a_second_server_beyond_guarantee_and_a_service_may_use_the_headroom():
    alloc = four(kept(2))
    granted(train(alloc, 0))
    granted(train(alloc, 1))
    assert queued(train(alloc, 2)).reason == HEADROOM
    granted(alloc.submit(req("nb-1", "h100", "nb", server="a"), 5))
    second = granted(alloc.submit(req("nb-2", "h100", "nb", server="b"), 6))
    assert second.borrowed  # beyond guarantee, but never preempted: the headroom is for it
    inference = four(kept(4))
    svc = req("s", "h100", "svc", server="job:s", workload=INFERENCE)
    granted(inference.submit(svc, 0))


def test_a_training_within_its_own_guarantee_is_not_held_back():
    alloc = four(kept(2), trainer=4)
    for i in range(4):
        assert not granted(train(alloc, i)).borrowed


def test_units_count_a_multi_gpu_training_whole():
    alloc = four(kept(1))
    granted(train(alloc, 0, "h100x2"))  # leaves 2
    assert queued(train(alloc, 1, "h100x2")).reason == HEADROOM  # would leave 0


def test_without_a_headroom_every_grant_is_as_before():
    for alloc in (four(None), Allocator([h100_node("h", 4)], offers(), quotas())):
        assert all(granted(train(alloc, i)).borrowed for i in range(4))


def test_another_model_the_offer_allows_takes_the_grant_the_headroom_holds_back():
    a100s = Node("a", gpus=[Gpu(f"a-A{i}", i, A100) for i in range(2)])
    alloc = Allocator([h100_node("h", 2), a100s], offers(ANY), quotas(), headroom=kept(H100_80GB=2))
    nodes = {granted(train(alloc, i, "any")).node for i in range(2)}
    assert nodes == {"a"}  # the H100s are kept; the A100s keep nothing
    held = queued(train(alloc, 2, "any"))
    assert held.reason == HEADROOM and "H100-80GB" in held.message


def test_a_held_back_training_is_granted_once_enough_is_free():
    alloc = four(kept(1))
    for i in range(3):
        granted(train(alloc, i))
    queued(train(alloc, 3))
    granted(alloc.submit(req("nb-1", "h100", "nb", server="a"), 5))
    assert alloc.release("l-j0", 10) == []  # 1 free: the training would take the headroom
    assert alloc.waiters["l-j3"].reason == HEADROOM
    (grant,) = alloc.release("nb-1", 20)  # 2 free: it may take one
    assert grant.request.id == "l-j3"


def test_a_long_waiter_preempts_nothing_it_could_not_be_granted_for():
    # a 2-GPU training has waited long and holds the node; the 1-GPU training on it would make
    # room, but the grant would leave the kept GPU taken: nothing is preempted for it
    alloc = Allocator([h100_node("h", 4)], offers(), quotas(), reserve_after=0)
    granted(alloc.submit(req("nb-1", "h100", "nb", server="a"), 0))
    granted(alloc.submit(req("svc", "h100", "svc", server="s", workload=INFERENCE), 0))
    granted(train(alloc, 0))
    queued(train(alloc, 1, "h100x2", t=1.0))
    assert alloc.reclaimable_for(alloc.waiters["l-j1"].request, 100, None, "h")
    alloc.headroom = kept(1)
    assert alloc.reclaimable_for(alloc.waiters["l-j1"].request, 100, None, "h") == []


# -- the refill (PreemptJobs) -------------------------------------------------------------------


def busy(keep: int = 1) -> tuple[Allocator, dict, tuple]:
    """Three trainings (j0 oldest) and a notebook on four H100s kept ``keep``."""
    alloc = four(kept(keep))
    for i in range(3):
        granted(train(alloc, i))
    granted(alloc.submit(req("nb-1", "h100", "nb", server="a"), 5))
    workloads = {f"l-j{i}": TRAINING for i in range(3)}
    jobs = tuple(job(f"j{i}", user="trainer", workload=TRAINING) for i in range(3))
    return alloc, workloads, jobs


def preempt(alloc: Allocator, jobs: tuple, workloads: dict, **facts):
    return decided(
        alloc, c.PreemptJobs(), 100.0, classes=CLASSES, jobs=jobs, workloads=workloads, **facts
    )


def test_the_refill_gives_the_youngest_borrowed_training_its_notice_when_notebooks_used_it():
    alloc, workloads, jobs = busy()
    out = preempt(alloc, jobs, workloads)
    assert out.effects == (
        JobPreempting("j2", 400.0, refill_reason("H100-80GB", 1), grace=300, notice=HEADROOM),
    )
    assert out.answer == ["j2"]
    # the class's own grace
    slow = parse_classes({TRAINING: {"grace": 900}})
    (later,) = decided(
        alloc, c.PreemptJobs(), 100.0, classes=slow, jobs=jobs, workloads=workloads
    ).effects
    assert isinstance(later, JobPreempting) and later.deadline == 1000.0


def test_a_job_already_leaving_counts_as_free_so_no_second_notice_is_given():
    alloc, workloads, jobs = busy()
    leaving = tuple(replace(j, state="preempting") if j.id == "j0" else j for j in jobs)
    assert preempt(alloc, leaving, workloads).effects == ()


def test_nothing_is_refilled_while_enough_is_free_or_without_a_headroom():
    alloc, workloads, jobs = busy()
    alloc.release("nb-1", 50)
    assert preempt(alloc, jobs, workloads).effects == ()
    alloc, workloads, jobs = busy()
    alloc.headroom = None
    assert preempt(alloc, jobs, workloads).effects == ()


def test_a_granted_job_never_started_ends_at_once():
    alloc, workloads, jobs = busy()
    jobs = (*jobs[:2], replace(jobs[2], state="granted"))
    facts = {"l-j2": lease("l-j2", "granted", user="trainer", server="job:j2", holder="job")}
    (ended,) = preempt(alloc, jobs, workloads, leases=facts).effects
    assert isinstance(ended, JobEnded) and ended.state == "preempted"
    assert ended.reason == refill_reason("H100-80GB", 1)
    assert ended.lease[0] == LeaseReleased("l-j2", "preempted", "granted")


def test_a_lease_promised_to_a_waiter_does_not_count_for_the_headroom():
    # four trainings hold the node (granted before the headroom was set); a notebook waits:
    # the youngest makes way for it, and the next youngest refills the kept GPU
    alloc = four(None)
    for i in range(4):
        granted(train(alloc, i))
    queued(alloc.submit(req("nb-1", "h100", "nb", server="a", arrival=5.0), 5))
    alloc.headroom = kept(1)
    workloads = {f"l-j{i}": TRAINING for i in range(4)}
    jobs = tuple(job(f"j{i}", user="trainer", workload=TRAINING) for i in range(4))
    out = preempt(alloc, jobs, workloads)
    first, second = out.effects
    assert isinstance(first, JobPreempting) and (first.job_id, first.for_request) == ("j3", "nb-1")
    assert isinstance(second, JobPreempting) and (second.job_id, second.notice) == ("j2", HEADROOM)


def test_inference_and_notebooks_are_never_taken_to_refill():
    alloc = four(kept(4))
    granted(alloc.submit(req("nb-1", "h100", "nb", server="a"), 0))
    granted(alloc.submit(req("nb-2", "h100", "nb", server="b"), 0))  # borrowed, interactive
    svc = req("l-s", "h100", "svc", server="job:s", workload=INFERENCE)
    granted(alloc.submit(svc, 0))
    jobs = (job("s", user="svc", workload=INFERENCE),)
    assert preempt(alloc, jobs, {"l-s": INFERENCE}).effects == ()


def test_the_refill_takes_the_fewest_notices_then_the_fewest_gpus_youngest_first():
    h = kept(2)

    def b(bid: str, units: int, at: float) -> Borrower:
        return Borrower(bid, "H100-80GB", Fraction(units), at)

    free = {"H100-80GB": 0.0}
    # the smallest that covers what is missing: the 2-GPU one
    assert [x.id for x in refill(h, free, {}, [b("y1", 1, 9), b("o2", 2, 1), b("x4", 4, 5)])] == [
        "o2"
    ]
    # none covers 5: the largest (youngest of equals), then what covers the rest
    five = kept(5)
    picks = refill(five, free, {}, [b("a", 1, 1), b("b", 1, 2), b("c", 4, 3), b("d", 4, 4)])
    assert [x.id for x in picks] == ["d", "b"]
    # units leaving count as free; another model is not taken for this one
    assert refill(h, free, {"H100-80GB": 2.0}, [b("y1", 1, 9)]) == []
    other = Borrower("a1", "A100-80GB", Fraction(1), 1)
    assert refill(h, free, {}, [other]) == []


def test_a_model_the_pool_has_none_of_misses_nothing():
    assert deficits(kept(H100_80GB=2), {}, {}) == {}
    assert deficits(kept(H100_80GB=2), {"H100-80GB": 0.5}, {"H100-80GB": 1.0}) == {"H100-80GB": 0.5}


# -- a node held for a long waiter --------------------------------------------------------------


def held_pool() -> Allocator:
    """Nodes ``a`` and ``b`` of two H100s, one kept free: trainings j0, j1 on ``a``, j2 on
    ``b``; j3 (two GPUs, at its class's queue priority -50) waits from 3 s and holds ``b``
    (long at once; one level of aging every 10 s)."""
    alloc = Allocator(
        [h100_node("a", 2), h100_node("b", 2)],
        offers(),
        quotas(),
        headroom=kept(1),
        reserve_after=0,
        aging_interval=10,
    )
    for i in range(3):
        granted(train(alloc, i))
    pair = req("l-j3", "h100x2", "trainer", server="job:j3", priority=-50, arrival=3.0)
    queued(alloc.submit(replace(pair, workload=TRAINING), 3.0))
    assert {lid: x.node for lid, x in alloc.leases.items()} == {
        "l-j0": "a",
        "l-j1": "a",
        "l-j2": "b",
    }
    return alloc


AGED = 3.0 + 51 * 10  # j3 at -50 + 51: above the notebooks' 0
YOUNG = 3.0 + 50 * 10  # at 0: a notebook asking now is still served first


def test_free_units_on_a_held_node_are_out_of_the_count_once_its_waiter_outranks_notebooks():
    alloc = held_pool()
    assert alloc.holds(YOUNG) == alloc.holds(AGED) == {"l-j3": "b"}
    assert alloc.headroom_free(YOUNG) == ({"H100-80GB": 1.0}, frozenset())
    assert alloc.headroom_free(AGED) == ({"H100-80GB": 0.0}, frozenset({"b"}))
    assert alloc.free_by_model() == {"H100-80GB": 1.0}  # the capacity view counts every node


def test_a_held_node_aged_past_notebooks_is_refilled_elsewhere_and_its_waiter_takes_it():
    alloc = held_pool()
    workloads = {f"l-j{i}": TRAINING for i in range(4)}
    jobs = tuple(job(f"j{i}", user="trainer", workload=TRAINING) for i in range(3))
    # young: b's free GPU is the headroom: j3 may not take it (nothing preempted for it) and
    # nothing is missing
    young = decided(alloc, c.PreemptJobs(), YOUNG, classes=CLASSES, jobs=jobs, workloads=workloads)
    assert young.effects == (NodeHeld("l-j3", "b"),)  # only b remembered as j3's
    # aged: b is j3's alone; j2 makes way for it there, and the youngest training elsewhere
    # (j1 on a) refills the kept GPU where a notebook may use it
    aged = decided(alloc, c.PreemptJobs(), AGED, classes=CLASSES, jobs=jobs, workloads=workloads)
    first, second, held = aged.effects
    assert held == NodeHeld("l-j3", "b")
    assert isinstance(first, JobPreempting) and (first.job_id, first.for_request) == ("j2", "l-j3")
    assert isinstance(second, JobPreempting) and (second.job_id, second.notice) == ("j1", HEADROOM)
    # the grant rule: once j2 is gone, j3 takes b, though no other GPU is free (b's are no
    # headroom); young, it would wait for the headroom
    young_pool = held_pool()
    assert young_pool.release("l-j2", YOUNG) == []
    assert young_pool.waiters["l-j3"].reason == HEADROOM
    (grant,) = alloc.release("l-j2", AGED)
    assert (grant.request.id, grant.node) == ("l-j3", "b")


def test_the_refill_neither_notices_nor_counts_leaving_a_lease_on_a_held_node():
    # j3 only waits (no preempt_for_waiters): the refill alone. j2, the youngest, is on b:
    # what it frees is j3's, not the headroom, so j1 on a gets the notice; j2 already leaving
    # does not make up the kept GPU either
    waits = {**CLASSES, TRAINING: replace(CLASSES[TRAINING], preempt_for_waiters=False)}
    workloads = {f"l-j{i}": TRAINING for i in range(4)}
    for j2 in ("running", "preempting"):
        alloc = held_pool()
        jobs = tuple(
            job(f"j{i}", j2 if i == 2 else "running", user="trainer", workload=TRAINING)
            for i in range(3)
        )
        out = decided(alloc, c.PreemptJobs(), AGED, classes=waits, jobs=jobs, workloads=workloads)
        assert out.answer == ["j1"]
        # young, b's free GPU counts: nothing is missing
        young = decided(
            alloc, c.PreemptJobs(), YOUNG, classes=waits, jobs=jobs, workloads=workloads
        )
        assert young.answer == []


def test_the_count_leaves_a_held_node_out_above_the_lowest_never_preempted_class():
    assert kept(1).kept_for == 0  # notebooks (100) under inference (125), relative to 100
    low = parse_classes({"batch": {"priority": 80}})
    h = headroom_for(Headroom(1), low)
    assert h is not None and h.kept_for == -20
    assert h.holds_out(-19) and not h.holds_out(-20)

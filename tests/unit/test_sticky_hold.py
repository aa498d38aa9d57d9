"""The sticky hold (``pool.headroom.kept_hold``, ``hold_changes``): the node held for a long
waiter is kept until the waiter is granted or gone, or can no longer be served there, not
chosen afresh at every pass; ``PreemptJobs`` says which (``NodeHeld``) and the applier
remembers it on the waiter."""

from __future__ import annotations

from dataclasses import replace
from fractions import Fraction

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.effects import NodeHeld
from jupyterhub_gpupool.pool.headroom import hold_changes, kept_hold
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.workloads import DEFAULT_CLASSES, TRAINING
from tests.allocrig import apply_all, decided, granted, h100_node, job, kept, offers, queued, req

#: Training only waits (no preemption for waiters): the rounds say only where it holds.
WAITS = {**DEFAULT_CLASSES, TRAINING: replace(DEFAULT_CLASSES[TRAINING], preempt_for_waiters=False)}
T = 100.0


def pool(keep_free: int = 1) -> Allocator:
    """Nodes a and b of two H100s: j0, j1 on a, j2 on b (borrowed trainings), and j3 asking
    for two GPUs: a long waiter at once, holding b (one GPU free there, none on a); one GPU
    kept free unless told."""
    alloc = Allocator(
        [h100_node("a", 2), h100_node("b", 2)],
        offers(),
        QuotaBook(users={"trainer": QuotaSpec(guarantee=Fraction(0))}),
        headroom=kept(keep_free) if keep_free else None,
        reserve_after=0,
        aging_interval=0,
    )
    for i in range(3):
        r = req(f"l-j{i}", "h100", "trainer", server=f"job:j{i}", arrival=float(i))
        granted(alloc.submit(replace(r, workload=TRAINING), float(i)))
    pair = req("l-j3", "h100x2", "trainer", server="job:j3", priority=-50, arrival=3.0)
    queued(alloc.submit(replace(pair, workload=TRAINING), 3.0))
    assert {lid: x.node for lid, x in alloc.leases.items()} == {
        "l-j0": "a",
        "l-j1": "a",
        "l-j2": "b",
    }
    return alloc


def preempt(alloc: Allocator, running: tuple[int, ...] = (0, 1, 2)):
    jobs = tuple(
        job(f"j{i}", lease_id=f"l-j{i}", user="trainer", workload=TRAINING) for i in running
    )
    workloads = {f"l-j{i}": TRAINING for i in range(4)}
    return decided(alloc, c.PreemptJobs(), T, classes=WAITS, jobs=jobs, workloads=workloads)


def test_the_round_remembers_the_node_held_and_then_says_nothing_while_it_stays():
    alloc = pool()
    assert alloc.waiters["l-j3"].hold is None
    first = preempt(alloc)
    assert first.effects == (NodeHeld("l-j3", "b"),)
    apply_all(alloc, first.effects, T)
    assert alloc.waiters["l-j3"].hold == "b"
    assert preempt(alloc).effects == ()


def test_a_node_that_becomes_closer_does_not_take_the_hold_over():
    # j0 ends: a and b now each have one GPU free and one 1-GPU training: a tie that node
    # order gives to a, chosen afresh; remembered, b stays held
    fresh, sticky = pool(), pool()
    apply_all(sticky, preempt(sticky).effects, T)
    for alloc in (fresh, sticky):
        assert alloc.release("l-j0", T) == []  # j3 fits on neither
    assert fresh.holds(T) == {"l-j3": "a"}
    assert sticky.holds(T) == {"l-j3": "b"}
    assert sticky.headroom_free(T)[1] == frozenset()  # j3 (−50) does not outrank notebooks
    assert preempt(sticky, (1, 2)).effects == ()
    # a newcomer that would fit only on b waits behind j3 for fairness; a stays open
    one = req("nb1", "h100", "trainer", arrival=T)
    decision = sticky.decide(replace(one, workload=TRAINING), T)
    assert getattr(decision, "node", None) == "a"


def test_a_drained_node_lets_the_hold_go_and_the_round_says_where_it_went():
    alloc = pool(keep_free=0)
    apply_all(alloc, preempt(alloc).effects, T)
    alloc.set_node_flags("b", draining=True)
    assert alloc.holds(T) == {"l-j3": "a"}
    out = preempt(alloc)
    assert out.effects == (NodeHeld("l-j3", "a"),)
    apply_all(alloc, out.effects, T)
    assert alloc.waiters["l-j3"].hold == "a"
    # undrained, b is closer again (a free GPU there), but a stays held
    alloc.set_node_flags("b", draining=False)
    assert alloc.holds(T) == {"l-j3": "a"}


def test_a_granted_waiter_takes_its_hold_along():
    alloc = pool(keep_free=0)
    apply_all(alloc, preempt(alloc).effects, T)
    (grant,) = alloc.release("l-j2", T)  # b comes free: j3 is served there
    assert (grant.request.id, grant.node) == ("l-j3", "b")
    assert alloc.holds(T) == {}
    assert preempt(alloc, (0, 1)).effects == ()


def test_kept_hold_keeps_a_remembered_node_only_while_it_could_serve_the_waiter():
    a, b = h100_node("a", 2), replace(h100_node("b", 2), cluster="east")
    nodes = [(a, 2.0), (b, 1.0)]
    assert kept_hold("b", nodes, None, set(), {}) == "b"
    assert kept_hold("b", nodes, {"east"}, set(), {}) == "b"
    assert kept_hold(None, nodes, None, set(), {}) is None  # none remembered: choose afresh
    assert kept_hold("b", nodes, {"default"}, set(), {}) is None  # outside the waiter's clusters
    assert kept_hold("b", nodes, None, {"b"}, {}) is None  # held for a waiter ahead
    assert kept_hold("b", [(a, 2.0), (b, None)], None, set(), {}) is None  # too few usable GPUs
    assert kept_hold("c", nodes, None, set(), {}) is None  # left the pool


def test_hold_changes_names_what_to_remember_and_what_to_forget():
    remembered = {"w1": "a", "w2": "b", "w3": None, "w4": None}
    holds = {"w1": "a", "w3": "c"}
    assert hold_changes(holds, remembered) == [("w2", None), ("w3", "c")]
    assert hold_changes({}, {}) == []


def test_kept_hold_with_pinned_keeps_a_remembered_node_only_while_it_is_least_pinned():
    a, b, c = h100_node("a", 2), h100_node("b", 2), h100_node("c", 2)
    nodes = [(a, 2.0), (b, 1.0), (c, 0.0)]
    # b is as little pinned as any node it could use: kept
    assert kept_hold("b", nodes, None, set(), {"a": 1.0, "c": 1.0}) == "b"
    assert kept_hold("b", nodes, None, set(), {}) == "b"
    # a notebook within guarantee was granted on b: a is less pinned now, choose afresh
    assert kept_hold("b", nodes, None, set(), {"b": 1.0}) is None
    # ... unless the less pinned node is no choice: held for a waiter ahead, outside the
    # waiter's clusters, or too few usable GPUs there
    assert kept_hold("b", nodes, None, {"a", "c"}, {"b": 1.0}) == "b"
    assert kept_hold("b", [(a, None), (b, 1.0)], None, set(), {"b": 1.0}) == "b"
    east = replace(h100_node("e", 2), cluster="east")
    assert kept_hold("b", [(east, 2.0), (b, 1.0)], {"default"}, set(), {"b": 1.0}) == "b"

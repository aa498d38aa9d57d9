"""The allocator (placement, queue, quotas, leases): exact grants, queueing,
quota holds, fair promotion, unschedulable hardware, reclaim candidates, starvation guard and
fragmentation-aware MIG placement."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.allocator import Allocator, Rejected
from jupyterhub_gpupool.pool.miglayout import validate_mig_layout
from jupyterhub_gpupool.pool.model import Gpu, MigInstance, Node, parse_offer
from jupyterhub_gpupool.pool.placement import Slot
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from tests.allocrig import (
    A100,
    CATALOG,
    H100,
    granted,
    h100_node,
    mig_node,
    offers,
    pool,
    queued,
    req,
)


def fill_h100(alloc: Allocator, user: str = "filler", n: int = 4, now: float = 0.0) -> list[str]:
    ids = []
    for i in range(n):
        rid = f"{user}-{i}"
        granted(alloc.submit(req(rid, "h100", user), now))
        ids.append(rid)
    return ids


def free_gpus(alloc: Allocator, node: str) -> int:
    return sum(1 for g in alloc.nodes[node].gpus if g.is_idle)


# -- grants with exact slices --------------------------------------------------------------


def test_mig_slice_grant_is_one_legal_instance_with_its_units():
    alloc = pool()
    g = granted(alloc.submit(req("r1", "a100-1g"), 0))
    assert g.node == "mig"
    assert g.units == Fraction(1, 7)
    (slot,) = g.slots
    assert slot.kind == "mig" and slot.profile == "1g.10gb"
    assert slot.gpu in {"mig-A0", "mig-A1"}
    assert slot.start in A100.profile("1g.10gb").starts
    gpu = alloc.gpus[slot.gpu]
    assert [(i.profile, i.start, i.lease) for i in gpu.instances] == [("1g.10gb", slot.start, "r1")]
    assert alloc.leases["r1"].slots == g.slots
    assert alloc.quotas.held("u") == Fraction(1, 7)


def test_three_g_grant_costs_half_a_unit_at_a_legal_start():
    alloc = pool()
    g = granted(alloc.submit(req("r1", "a100-3g"), 0))
    (slot,) = g.slots
    assert g.units == Fraction(1, 2)
    assert slot.start in (0, 4)


def test_whole_gpus_multi_gpu_on_one_node():
    alloc = pool()
    g = granted(alloc.submit(req("r1", "h100x2"), 0))
    assert g.units == 2
    assert [s.kind for s in g.slots] == ["gpu", "gpu"]
    assert len({s.gpu for s in g.slots}) == 2
    assert all(alloc.gpus[s.gpu].node == "h" for s in g.slots)
    assert all(alloc.gpus[s.gpu].whole_lease == "r1" for s in g.slots)


def test_single_gpus_bin_pack_keeping_a_node_whole_for_pairs():
    alloc = Allocator([h100_node("h", 2), h100_node("k", 2)], offers())
    a = granted(alloc.submit(req("a", "h100"), 0))
    b = granted(alloc.submit(req("b", "h100"), 0))
    # the second single GPU goes to the node already in use, keeping the other node whole
    assert a.node == b.node
    c = granted(alloc.submit(req("c", "h100x2"), 0))
    assert c.node != a.node


def test_two_free_gpus_on_two_nodes_do_not_make_a_pair():
    alloc = Allocator([h100_node("h", 2), h100_node("k", 2)], offers())
    for rid in ("a", "b", "c", "d"):
        granted(alloc.submit(req(rid, "h100"), 0))
    on = {node: [r for r in "abcd" if alloc.leases[r].node == node] for node in ("h", "k")}
    assert len(on["h"]) == len(on["k"]) == 2
    alloc.release(on["h"][0], 1)
    alloc.release(on["k"][0], 1)
    assert alloc.capacity()["free"] == 2.0
    q = queued(alloc.submit(req("pair", "h100x2"), 2))
    assert q.reason == "no_capacity"
    (grant,) = alloc.release(on["k"][1], 3)
    assert grant.request.id == "pair" and grant.node == "k"


def test_shared_fractions_pack_on_one_gpu_before_opening_another():
    alloc = pool()
    grants = [granted(alloc.submit(req(f"s{i}", "shared"), 0)) for i in range(5)]
    gpus = [g.slots[0].gpu for g in grants]
    assert len(set(gpus[:4])) == 1, gpus
    assert gpus[4] != gpus[0]
    first = alloc.gpus[gpus[0]]
    assert first.shares == {f"s{i}": 250 for i in range(4)}
    assert first.free_milli == 0
    assert all(g.units == Fraction(1, 4) for g in grants)
    assert all(s.kind == "shared" and s.milli == 250 for g in grants for s in g.slots)
    # a whole GPU then goes to a GPU without shares
    whole = granted(alloc.submit(req("w", "h100"), 0))
    assert whole.slots[0].gpu not in set(gpus)


def test_node_cpu_and_memory_are_checked():
    offer = {
        "name": "big-cpu",
        "kind": "gpu",
        "models": ["H100-80GB"],
        "cpu_milli": 3000,
        "memory_mib": 1000,
    }
    alloc = Allocator([h100_node(cpu_milli=4000, memory_mib=100_000)], offers(offer))
    granted(alloc.submit(req("a", "big-cpu"), 0))
    assert alloc.nodes["h"].cpu_used == 3000
    q = queued(alloc.submit(req("b", "big-cpu"), 0))
    assert q.reason == "no_capacity"
    assert alloc.capacity()["free"] == 3.0  # the GPUs are free, the CPUs are not
    assert [g.request.id for g in alloc.release("a", 1)] == ["b"]
    assert alloc.nodes["h"].cpu_used == 3000


# -- queueing -------------------------------------------------------------------------------


def test_queue_when_full_with_position_and_reason():
    alloc = pool()
    fill_h100(alloc)
    q1 = queued(alloc.submit(req("q1", "h100", "a"), 1))
    q2 = queued(alloc.submit(req("q2", "h100", "b"), 2))
    assert (q1.position, q1.reason) == (1, "no_capacity")
    assert (q2.position, q2.reason) == (2, "no_capacity")
    assert q1.units == 1
    assert "h100" in q1.message
    assert alloc.position("q2", 3) == 2
    assert [w.request.id for w in alloc.queue(3)] == ["q1", "q2"]
    assert "q1" not in alloc.leases


def test_mig_queue_when_every_slice_is_taken():
    alloc = pool()
    for i in range(14):  # 7 × 1g.10gb on each of the two A100s
        granted(alloc.submit(req(f"m{i}", "a100-1g"), 0))
    assert alloc.quotas.held("u") == 2
    q = queued(alloc.submit(req("m14", "a100-1g"), 0))
    assert q.reason == "no_capacity" and q.position == 1


def test_quota_held_request_is_queued_and_granted_when_the_user_releases():
    alloc = pool(QuotaBook(users={"alice": QuotaSpec(limit=Fraction(1))}))
    granted(alloc.submit(req("a1", "h100", "alice"), 0))
    q = queued(alloc.submit(req("a2", "h100", "alice"), 1))
    assert q.reason == "quota"
    assert q.position == 1
    # somebody else's release does not help alice
    granted(alloc.submit(req("b1", "h100", "bob"), 2))
    assert alloc.release("b1", 3) == []
    assert alloc.waiters["a2"].reason == "quota"
    # alice's own release does
    (grant,) = alloc.release("a1", 4)
    assert grant.request.id == "a2"
    assert "a2" in alloc.leases and "a2" not in alloc.waiters
    assert alloc.quotas.held("alice") == 1


def test_never_grantable_requests_are_rejected():
    alloc = pool(
        QuotaBook(
            users={"alice": QuotaSpec(limit=Fraction(1)), "nobody": QuotaSpec(limit=Fraction(0))}
        )
    )
    r = alloc.submit(req("x", "h100x2", "alice"), 0)
    assert isinstance(r, Rejected) and r.code == "exceeds_limit"
    r = alloc.submit(req("y", "a100-1g", "nobody"), 0)
    assert isinstance(r, Rejected) and r.code == "no_quota"
    r = alloc.submit(req("z", "no-such-offer"), 0)
    assert isinstance(r, Rejected) and r.code == "unknown_offer" and r.field == "offer"
    assert not alloc.waiters and not alloc.leases


def test_more_gpus_than_any_node_has_is_rejected_with_the_allowed_counts():
    alloc = Allocator(
        [h100_node(n=4)],
        offers({"name": "h100x8", "kind": "gpu", "count": 8, "models": ["H100-80GB"]}),
    )
    r = alloc.submit(req("x", "h100x8"), 0)
    assert isinstance(r, Rejected)
    assert r.code == "exceeds_node_size"
    assert r.field == "count"
    assert r.allowed == (1, 2, 3, 4)


def test_duplicate_request_id_is_rejected_while_leased_or_queued():
    alloc = pool()
    granted(alloc.submit(req("dup", "h100"), 0))
    r = alloc.submit(req("dup", "h100"), 1)
    assert isinstance(r, Rejected) and r.code == "duplicate_request" and r.field == "id"
    assert len(alloc.leases) == 1
    fill_h100(alloc, n=3)
    queued(alloc.submit(req("dup-q", "h100"), 2))
    r = alloc.submit(req("dup-q", "h100"), 3)
    assert isinstance(r, Rejected) and r.code == "duplicate_request"
    assert list(alloc.waiters) == ["dup-q"]


# -- fair promotion ---------------------------------------------------------------------------


def test_release_promotes_the_higher_priority_waiter_not_the_earliest():
    alloc = pool(aging_interval=0)
    leases = fill_h100(alloc)
    queued(alloc.submit(req("early-low", "h100", "a", priority=0), 1))
    queued(alloc.submit(req("late-high", "h100", "b", priority=5), 2))
    grants = alloc.release(leases[0], 3)
    assert [g.request.id for g in grants] == ["late-high"]
    assert list(alloc.waiters) == ["early-low"]
    assert alloc.leases["late-high"].slots == (Slot("h-H0", "gpu", 1000),)


def test_release_promotes_within_guarantee_before_borrowing():
    alloc = pool(QuotaBook(users={"g": QuotaSpec(guarantee=Fraction(1))}), aging_interval=0)
    leases = fill_h100(alloc)
    queued(alloc.submit(req("borrower", "h100", "b"), 1))
    queued(alloc.submit(req("guaranteed", "h100", "g"), 2))
    grants = alloc.release(leases[2], 3)
    assert [g.request.id for g in grants] == ["guaranteed"]
    assert not grants[0].borrowed


def test_release_promotes_everybody_who_fits_in_order():
    alloc = pool(aging_interval=0)
    fill_h100(alloc, user="big", n=2)
    granted(alloc.submit(req("pair", "h100x2", "big"), 0))
    queued(alloc.submit(req("w1", "h100", "a"), 1))
    queued(alloc.submit(req("w2", "h100", "b"), 2))
    queued(alloc.submit(req("w3", "h100", "c"), 3))
    grants = alloc.release("pair", 4)
    assert [g.request.id for g in grants] == ["w1", "w2"]
    assert alloc.position("w3", 4) == 1


def test_a_small_waiter_behind_a_big_one_is_served_when_the_big_one_cannot_fit():
    # below reserve_after there is no reservation: the queue is work-conserving
    alloc = pool(aging_interval=0, reserve_after=1000)
    leases = fill_h100(alloc)
    queued(alloc.submit(req("pair", "h100x2", "a"), 1))
    queued(alloc.submit(req("single", "h100", "b"), 2))
    grants = alloc.release(leases[0], 3)
    assert [g.request.id for g in grants] == ["single"]


def test_starvation_guard_keeps_capacity_for_a_long_waiting_multi_gpu_ask():
    alloc = pool(aging_interval=0, reserve_after=100)
    leases = fill_h100(alloc)
    queued(alloc.submit(req("pair", "h100x2", "patient"), 0))
    # before reserve_after a newcomer may still take a single free GPU
    assert alloc.release(leases[0], 50) == []
    granted(alloc.submit(req("early-bird", "h100", "x"), 60))
    # after reserve_after a freed GPU is held back for the pair...
    assert alloc.release("early-bird", 150) == []
    assert free_gpus(alloc, "h") == 1
    late = queued(alloc.submit(req("newcomer", "h100", "y"), 160))
    assert late.reason == "fairness"
    assert late.position == 2
    late2 = queued(alloc.submit(req("newcomer-2", "h100", "z"), 161))
    assert late2.reason == "fairness"
    assert free_gpus(alloc, "h") == 1
    # ...until it fits: then the pair is served first
    grants = alloc.release(leases[1], 170)
    assert [g.request.id for g in grants] == ["pair"]
    assert alloc.position("newcomer", 170) == 1
    # a MIG ask is not held back by a reservation for H100s
    granted(alloc.submit(req("mig", "a100-1g", "y"), 171))


def test_reservation_only_holds_back_requests_ranked_behind_the_long_waiter():
    # a higher-priority newcomer ranks ahead of the long-waiting pair, so it is not held back
    alloc = pool(aging_interval=0, reserve_after=100)
    leases = fill_h100(alloc)
    queued(alloc.submit(req("pair", "h100x2", "patient"), 0))
    assert alloc.release(leases[0], 150) == []  # one GPU free, reserved for the pair
    urgent = granted(alloc.submit(req("urgent", "h100", "vip", priority=5), 160))
    assert urgent.node == "h"
    # nothing is free now: the next one waits for capacity, not for the pair
    assert queued(alloc.submit(req("normal", "h100", "x"), 161)).reason == "no_capacity"
    # a GPU frees: it is kept for the pair ranked ahead, and the newcomer now waits for that
    assert alloc.release(leases[1], 162) == []
    assert alloc.waiters["normal"].reason == "fairness"


# -- cordoned, draining, unhealthy -----------------------------------------------------------


@pytest.mark.parametrize("flag", ["cordoned", "draining"])
def test_unschedulable_node_takes_nothing_new_but_keeps_its_leases(flag):
    alloc = pool()
    g = granted(alloc.submit(req("kept", "h100"), 0))
    assert alloc.capacity()["total"] == 6.0
    alloc.set_node_flags("h", **{flag: True})
    assert alloc.leases["kept"].slots == g.slots
    assert alloc.gpus[g.slots[0].gpu].whole_lease == "kept"
    assert alloc.capacity()["total"] == 2.0
    q = queued(alloc.submit(req("new", "h100"), 1))
    assert q.reason == "no_capacity"
    queued(alloc.submit(req("new-shared", "shared"), 1))
    # the MIG node is unaffected
    granted(alloc.submit(req("mig", "a100-1g"), 1))
    # releasing on the unschedulable node frees the GPU but nobody is placed there
    assert alloc.release("kept", 2) == []
    assert alloc.gpus[g.slots[0].gpu].whole_lease is None
    assert set(alloc.waiters) == {"new", "new-shared"}
    alloc.set_node_flags("h", **{flag: False})
    assert {x.request.id for x in alloc.promote(3)} == {"new", "new-shared"}


def test_cordoned_mig_node_takes_no_new_slices():
    alloc = pool()
    granted(alloc.submit(req("kept", "a100-1g"), 0))
    alloc.set_node_flags("mig", cordoned=True)
    assert queued(alloc.submit(req("new", "a100-1g"), 1)).reason == "no_capacity"
    assert "kept" in alloc.leases


def test_unhealthy_gpu_takes_nothing_new_but_keeps_its_lease():
    alloc = pool()
    g = granted(alloc.submit(req("kept", "shared"), 0))
    uuid = g.slots[0].gpu
    alloc.set_gpu_health(uuid, False)
    assert alloc.gpus[uuid].shares == {"kept": 250}
    assert alloc.capacity()["total"] == 5.0
    # a new share does not join the sick GPU although it has 750 milli free
    other = granted(alloc.submit(req("new", "shared"), 1))
    assert other.slots[0].gpu != uuid
    # with every other H100 taken, whole GPUs have to wait
    fill_h100(alloc, n=2)
    assert queued(alloc.submit(req("whole", "h100"), 2)).reason == "no_capacity"
    alloc.set_gpu_health(uuid, True)
    assert [x.request.id for x in alloc.promote(3)] == []  # the GPU still holds a share
    alloc.release("kept", 4)
    assert "whole" in alloc.leases


def test_unhealthy_mig_gpu_takes_no_new_slices():
    alloc = Allocator([mig_node(n=1)], offers())
    alloc.set_gpu_health("mig-A0", False)
    assert queued(alloc.submit(req("x", "a100-1g"), 0)).reason == "no_capacity"
    alloc.set_gpu_health("mig-A0", True)
    assert [g.request.id for g in alloc.promote(1)] == ["x"]


# -- reclaim candidates -------------------------------------------------------------------------


def _reclaim_pool() -> Allocator:
    quotas = QuotaBook(
        users={"vip": QuotaSpec(guarantee=Fraction(1)), "g": QuotaSpec(guarantee=Fraction(2))}
    )
    alloc = pool(quotas)
    granted(alloc.submit(req("g1", "h100", "g"), 0))
    granted(alloc.submit(req("g2", "h100", "g"), 0))
    b1 = granted(alloc.submit(req("b1", "h100", "b", arrival=1.0), 1))
    b2 = granted(alloc.submit(req("b2", "h100", "b", arrival=2.0), 2))
    assert b1.borrowed and b2.borrowed
    assert not alloc.leases["g1"].borrowed and not alloc.leases["g2"].borrowed
    return alloc


def test_reclaimable_for_returns_the_borrowed_lease_that_makes_room():
    alloc = _reclaim_pool()
    ask = req("v", "h100", "vip")
    assert queued(alloc.decide(ask, 3)).within_guarantee
    found = alloc.reclaimable_for(ask, 3)
    # b's leases are both borrowed: the younger goes (``borrowing.reclaim_order``)
    assert found == ["b2"]
    # the query changed nothing
    assert alloc.gpus[alloc.leases["b2"].slots[0].gpu].whole_lease == "b2"
    assert alloc.capacity()["free"] == 2.0  # the two A100s
    alloc.release("b2", 4)
    granted(alloc.submit(ask, 5))


def test_reclaimable_for_takes_the_most_over_guarantee_first():
    """The reclaim rules' one order (``borrowing.reclaim_order``): the owner most over
    guarantee first, then the youngest; not the lowest priority or the newest overall."""
    quotas = QuotaBook(users={"vip": QuotaSpec(guarantee=Fraction(1))})
    alloc = pool(quotas)
    granted(alloc.submit(req("b0", "h100", "b", arrival=0), 0))
    granted(alloc.submit(req("b1", "h100", "b", arrival=1), 0))
    granted(alloc.submit(req("a0", "h100", "a", priority=-5, arrival=5), 0))  # newest, lowest
    fill_h100(alloc, n=1)
    assert alloc.reclaimable_for(req("v", "h100", "vip"), 1) == ["b1"]


def test_reclaimable_for_never_offers_leases_within_guarantee():
    alloc = _reclaim_pool()
    alloc.release("b1", 3)
    alloc.release("b2", 3)
    granted(alloc.submit(req("g3", "h100", "g"), 4))  # g is beyond guarantee: borrowed
    granted(alloc.submit(req("g4", "h100", "g"), 4))
    assert alloc.leases["g3"].borrowed and alloc.leases["g4"].borrowed
    found = alloc.reclaimable_for(req("v", "h100", "vip"), 5)
    assert len(found) == 1 and found[0] in {"g3", "g4"}


def test_reclaimable_for_is_empty_for_a_borrowing_request():
    alloc = _reclaim_pool()
    assert alloc.reclaimable_for(req("x", "h100", "nobody-special"), 3) == []


def test_reclaimable_for_is_empty_when_it_fits_already_or_nothing_is_borrowed():
    alloc = _reclaim_pool()
    assert alloc.reclaimable_for(req("v", "a100-1g", "vip"), 3) == []  # the A100s are free
    quotas = QuotaBook(
        users={"vip": QuotaSpec(guarantee=Fraction(1)), "g": QuotaSpec(guarantee=Fraction(4))}
    )
    alloc = pool(quotas)
    fill_h100(alloc, user="g")
    assert not any(lease.borrowed for lease in alloc.leases.values())
    assert alloc.reclaimable_for(req("v", "h100", "vip"), 1) == []


def test_reclaimable_for_only_lists_leases_whose_release_is_needed():
    quotas = QuotaBook(
        users={"vip": QuotaSpec(guarantee=Fraction(1)), "c": QuotaSpec(guarantee=Fraction(1))}
    )
    alloc = pool(quotas)
    # H0: one borrowed low-priority share (b) + three within-guarantee shares (c)
    granted(alloc.submit(req("s-b", "shared", "b", priority=-1), 0))
    for i in range(3):
        assert not granted(alloc.submit(req(f"s-c{i}", "shared", "c"), 0)).borrowed
    # H1..H3: whole GPUs, borrowed
    for i in range(3):
        granted(alloc.submit(req(f"w{i}", "h100", "d"), 0))
    found = alloc.reclaimable_for(req("v", "h100", "vip"), 1)
    # Releasing s-b alone leaves H0 at 750 milli: it cannot make room for a whole GPU.
    # One whole borrowed GPU is enough ("the list is as short as the placement allows").
    assert "s-b" not in found
    assert len(found) == 1 and found[0].startswith("w")


def test_reclaimable_for_skips_a_lease_that_is_within_guarantee_now():
    quotas = QuotaBook(
        users={"g": QuotaSpec(guarantee=Fraction(1)), "vip": QuotaSpec(guarantee=Fraction(1))}
    )
    alloc = pool(quotas)
    granted(alloc.submit(req("A", "h100", "g"), 0))
    assert granted(alloc.submit(req("B", "h100", "g"), 0)).borrowed
    granted(alloc.submit(req("o0", "h100", "o"), 0))
    granted(alloc.submit(req("o1", "h100", "o"), 0))
    alloc.release("A", 1)
    granted(alloc.submit(req("o2", "h100", "o"), 1))
    # g now holds exactly its guarantee (1 unit, lease B): the rule says only a lease "beyond
    # its owner's guarantee is borrowed and may be reclaimed"; o's leases are the borrowed ones.
    assert alloc.quotas.held("g") == alloc.quotas.user_spec("g").guarantee
    assert alloc.leases["B"].borrowed is False
    found = alloc.reclaimable_for(req("v", "h100", "vip"), 2)
    assert found and "B" not in found


# -- MIG: dynamic vs static, fragmentation-aware starts ---------------------------------------


def test_dynamic_mig_creates_an_instance_on_an_empty_gpu():
    alloc = Allocator([mig_node(n=1)], offers())
    g = granted(alloc.submit(req("r", "a100-1g"), 0))
    assert g.slots[0].create is True
    gpu = alloc.gpus["mig-A0"]
    assert len(gpu.instances) == 1 and gpu.instances[0].lease == "r"
    # the instance was made for the lease: it goes with it
    alloc.release("r", 1)
    assert gpu.instances == []


def test_dynamic_mig_reuses_a_declared_free_instance_and_keeps_it():
    gpu = Gpu(
        "D0",
        0,
        A100,
        mig_enabled=True,
        dynamic_mig=True,
        instances=[MigInstance("1g.10gb", 6, "MIG-x")],
    )
    alloc = Allocator([Node("d", gpus=[gpu])], offers())
    g = granted(alloc.submit(req("r", "a100-1g"), 0))
    # taking the existing instance at 6 changes no layout; creating one anywhere else would
    # add a second instance and block more placements
    assert (g.slots[0].start, g.slots[0].create) == (6, False)
    alloc.release("r", 1)
    assert [(i.profile, i.start, i.uuid, i.lease) for i in gpu.instances] == [
        ("1g.10gb", 6, "MIG-x", None)
    ]
    validate_mig_layout(A100, [(i.profile, i.start) for i in gpu.instances])


def test_static_mig_only_grants_existing_free_instances():
    gpu = Gpu(
        "S0",
        0,
        A100,
        mig_enabled=True,
        instances=[
            MigInstance("3g.40gb", 0, "MIG-a"),
            MigInstance("1g.10gb", 4, "MIG-b"),
            MigInstance("1g.10gb", 5, "MIG-c"),
        ],
    )
    alloc = Allocator([Node("s", gpus=[gpu])], offers())
    starts = []
    for i in range(2):
        g = granted(alloc.submit(req(f"q{i}", "a100-1g"), 0))
        assert g.slots[0].create is False
        starts.append(g.slots[0].start)
    assert sorted(starts) == [4, 5]
    # slices 6 and 7 are free memory, but a static GPU cannot create an instance there
    assert queued(alloc.submit(req("q2", "a100-1g"), 0)).reason == "no_capacity"
    three = granted(alloc.submit(req("q3", "a100-3g"), 0))
    assert (three.slots[0].start, three.slots[0].create) == (0, False)
    assert queued(alloc.submit(req("q4", "a100-3g"), 0)).reason == "no_capacity"
    assert len(gpu.instances) == 3


def test_mig_on_a_non_mig_only_pool_is_rejected():
    alloc = Allocator([h100_node()], offers())
    r = alloc.submit(req("x", "a100-1g"), 0)
    assert isinstance(r, Rejected) and r.code == "no_such_hardware"


def _single_a100(*profiles: str) -> Allocator:
    extra = [{"name": p, "kind": "mig", "profile": p, "models": ["A100-80GB"]} for p in profiles]
    return Allocator([mig_node(n=1)], [parse_offer(raw, CATALOG) for raw in extra])


def test_three_g_goes_to_start_4_keeping_0_to_3_for_a_4g_or_3g():
    # A100-80GB: 8 memory slices, 3g.40gb starts at 0 or 4, 4g.40gb only at 0, 1g.10gb at 0..6.
    # 3g at 0 would leave slices 4-7, where no 4g can go and where slice 7 is unusable by 1g;
    # 3g at 4 leaves 0-3, where a 4g (compute 3+4 = 7), a 3g or four 1g still fit.
    alloc = _single_a100("1g.10gb", "3g.40gb", "4g.40gb")
    g = granted(alloc.submit(req("r", "3g.40gb"), 0))
    assert g.slots[0].start == 4
    assert granted(alloc.submit(req("r4", "4g.40gb"), 0)).slots[0].start == 0
    # in the full demo pool too
    assert granted(pool().submit(req("r", "a100-3g"), 0)).slots[0].start == 4


def test_one_g_lands_where_it_leaves_the_most_placeable():
    # Demand: 1g.10gb (starts 0..6, size 1), 2g.20gb (starts 0,2,4, size 2),
    # 3g.40gb (starts 0,4, size 4), 4g.40gb (start 0 only, size 4), all weighted equally.
    # A 1g on an empty A100 at start s:
    #  - s in 0..3 breaks the only 4g placement (and the 3g at 0): 4g's fragment is all 7
    #    free slices -> clearly worse;
    #  - s = 4 or 5 blocks the 2g at 4, leaving 2g only 0-3 (its fragment: 3 of slices 4-7);
    #  - s = 6 keeps 2g at 0, 2 and 4, 3g at 0, 4g at 0 and 1g everywhere; the only slice
    #    nobody can use is 7, which no 1g/2g could use before either.
    # So the smallest increase of fragmentation is at start 6.
    alloc = _single_a100("1g.10gb", "2g.20gb", "3g.40gb", "4g.40gb")
    g = granted(alloc.submit(req("r", "1g.10gb"), 0))
    assert (g.slots[0].start, g.slots[0].create) == (6, True)
    # Without 2g in the demand, starts 4, 5 and 6 tie (each only blocks the 3g at 4, which the
    # 3g at 0 replaces); ties go to the lowest start: 4.
    alloc = _single_a100("1g.10gb", "3g.40gb", "4g.40gb")
    assert granted(alloc.submit(req("r", "1g.10gb"), 0)).slots[0].start == 4


def test_one_g_next_to_a_3g_packs_on_the_same_gpu():
    # Two empty dynamic A100s; 3g goes to A0 at 4. A 1g on A0 (slices 0-3) or on A1 costs the
    # same fragmentation (either way one GPU can no longer take a 3g at 0/4 with the 1g's
    # quarter), so the tie-break picks the tightest fit: A0, at its lowest start 0.
    alloc = pool()
    three = granted(alloc.submit(req("a", "a100-3g"), 0))
    assert (three.slots[0].gpu, three.slots[0].start) == ("mig-A0", 4)
    one = granted(alloc.submit(req("b", "a100-1g"), 0))
    assert (one.slots[0].gpu, one.slots[0].start) == ("mig-A0", 0)


def test_idle_dynamic_mig_gpu_can_be_repartitioned():
    alloc = _single_a100("1g.10gb", "7g.80gb")
    granted(alloc.submit(req("a", "1g.10gb"), 0))
    alloc.release("a", 1)
    assert alloc.capacity()["free"] == 1.0
    # with dynamic MIG the pool creates instances "on free memory slices"; all 8 are
    # free (nobody holds anything on this GPU).
    granted(alloc.submit(req("b", "7g.80gb"), 2))


def test_capacity_counts_free_units():
    alloc = pool()
    assert alloc.capacity() == {"total": 6.0, "free": 6.0, "used": 0.0}
    granted(alloc.submit(req("a", "a100-3g"), 0))
    granted(alloc.submit(req("b", "shared"), 0))
    cap = alloc.capacity()
    assert cap["free"] == pytest.approx(6.0 - 0.5 - 0.25)
    assert cap["used"] == pytest.approx(0.75)


def test_promote_leaves_no_grantable_waiter_first_in_line():
    t4 = CATALOG.model("T4")
    nodes = [
        Node("h", gpus=[Gpu("H0", 0, H100), Gpu("H1", 1, H100)]),
        Node("m", gpus=[Gpu("A0", 0, A100, mig_enabled=True, dynamic_mig=True)]),
        Node("t", gpus=[Gpu("T0", 0, t4)]),
    ]
    pool_offers = offers({"name": "t4q", "kind": "shared", "fraction": 0.25, "models": ["T4"]})
    quotas = QuotaBook(
        users={"zx": QuotaSpec(limit=Fraction(1))},
        groups={"gx": QuotaSpec(guarantee=Fraction(4)), "gy": QuotaSpec(guarantee=Fraction(10))},
    )
    alloc = Allocator(nodes, pool_offers, quotas, aging_interval=0, reserve_after=100)
    granted(alloc.submit(req("L", "h100", "zx", groups=("gx",)), 0))
    granted(alloc.submit(req("M", "h100", "o"), 0))
    granted(alloc.submit(req("Y", "t4q", "yy", groups=("gy",)), 0))  # gy share: 0.25/10
    queued(alloc.submit(req("R", "h100x2", "rx", groups=("gx",)), 0))  # will wait long
    assert queued(alloc.submit(req("Z", "a100-1g", "zx", groups=("gx",)), 1)).reason == "quota"
    queued(alloc.submit(req("X", "h100", "xy", groups=("gy",)), 2))
    # zx releases L at 200: the pass runs in the order R (gx share 0), Z (gx 0), X (gy 0.025).
    # R does not fit and has waited past reserve_after: it holds the H100s back; Z (MIG) is
    # granted, which lifts gx's share to (1/7)/4 ≈ 0.036; X is skipped for R's reservation.
    # The order is now X, R, and X fits on the free H100: promote must carry on (and grant X)
    # rather than stop after one pass.
    assert "Z" in [g.request.id for g in alloc.release("L", 200)]
    assert alloc.promote(200) == []


def test_forgetting_dead_node_states_keeps_decisions_the_same():
    # the allocator forgets node states no node is in (bounded memory); decisions must not change
    def run(prune: bool) -> list[tuple]:
        alloc = pool()
        out = []
        for i in range(12):
            offer = ["a100-1g", "h100", "shared", "a100-3g"][i % 4]
            d = alloc.submit(req(f"r{i}", offer, f"u{i}"), i)
            out.append((d.kind, getattr(d, "node", None), getattr(d, "slots", ())))
            if i % 3 == 2:
                alloc.release(f"r{i - 1}", i)
            if prune:
                alloc._forget_dead(budget=10**6, keep=0)
                assert set(alloc._sigs) == set(alloc._groups)
        return out

    assert run(prune=True) == run(prune=False)


def test_a_demand_change_is_scored_a_few_node_states_per_decision():
    # 120 MIG nodes in distinct states: re-scoring them all inside one decision was the
    # allocator's longest pause. The new weights apply once every live state is scored again,
    # and the scores then equal a fresh scoring under the new demand.
    from jupyterhub_gpupool.pool.placement import best_on_node

    nodes = [mig_node(f"m{i:03d}", 1 + i % 4) for i in range(120)]
    alloc = Allocator(nodes, offers(), demand_refresh=10**9, rescore_batch=1)
    for i in range(300):
        granted(alloc.submit(req(f"r{i}", ["a100-1g", "a100-3g"][i % 3 // 2], f"u{i}"), i))
    for i in range(0, 300, 7):
        alloc.release(f"r{i}", 300)
    assert len(alloc._groups) > 16
    old = alloc.demand
    table = alloc._options_of(old)
    before = dict(table)
    assert before  # the states' options, kept across changes of weights
    alloc._demand_counts = {"a100-3g": 500.0}
    alloc._refresh_demand()
    assert alloc._rescore is not None and alloc.demand is old  # not all at once
    steps = 0
    while alloc._rescore is not None:
        granted(alloc.submit(req(f"s{steps}", "a100-1g", f"v{steps}"), 400 + steps))
        alloc.release(f"s{steps}", 400 + steps)
        steps += 1
    assert alloc.demand is not old and steps > 3
    for sid in alloc._groups:
        for shape in alloc._heaps:
            if (sid, shape) in alloc._memo:
                fresh = best_on_node(alloc._sigs[sid], shape, alloc.demand)
                assert alloc._memo[(sid, shape)] == fresh
    # new weights, the same shapes: every state was re-scored from the options it already had
    assert alloc.demand.bare == old.bare and len(alloc._options) == 1
    assert alloc._options_of(alloc.demand) is table
    assert before.items() <= table.items()


def test_held_nodes_follow_the_whole_queue_order():
    # only long waiters ranked ahead of the newcomer hold nodes back, the first per set of
    # models one node each; the allocator compares just those with the newcomer, which must
    # agree with walking the whole sorted queue
    import random

    from jupyterhub_gpupool.pool.queue import Waiter, ordered
    from jupyterhub_gpupool.pool.reservation import (
        node_to_hold,
        pinned_units,
        smaller_borrowed_units,
        usable,
    )

    alloc = Allocator(
        [mig_node(), h100_node(), h100_node("k")], offers(), aging_interval=50, reserve_after=100
    )
    granted(alloc.submit(req("busy", "h100x2", "b"), 0))  # one H100 node is closer than the other
    rng = random.Random(7)
    names = [o.name for o in offers()] + ["gone"]  # a waiter whose offer was removed
    for i in range(40):
        r = req(f"w{i}", rng.choice(names), f"u{i % 5}", priority=rng.choice([0, 0, 1, 5]))
        since = float(rng.randrange(0, 300))
        reason = rng.choice(["no_capacity", "no_capacity", "quota", "fairness"])
        alloc.restore_waiter(Waiter(r, Fraction(1), None, rng.random() < 0.5, reason, since))

    def reference(now: float, newcomer: Waiter) -> frozenset[str]:
        held: set[str] = set()
        covered: set[str] = set()
        for w in ordered([*alloc.waiters.values(), newcomer], now, alloc._share, 50):
            if w is newcomer:
                break
            offer = alloc.offers.get(w.request.offer)
            if not (offer and now - w.since >= 100 and w.reason == "no_capacity"):
                continue
            models = set(offer.models) or {"*"}
            if covered and ("*" in covered or "*" in models or covered & models):
                continue
            covered |= models
            nodes = [(n, usable(n.signature(), offer)) for n in alloc.nodes.values()]
            leases = alloc.leases.values()

            def small(names, units=w.units, leases=leases):
                return smaller_borrowed_units(leases, units, names)

            node = node_to_hold(nodes, pinned_units(leases), None, held, small)
            held |= {node} if node else set()
        return frozenset(held)

    seen = set()
    for j in range(200):
        now = float(rng.randrange(0, 600))
        r = req(f"n{j}", rng.choice(names[:-1]), f"u{j % 7}", priority=rng.choice([0, 1, 5, 9]))
        newcomer = Waiter(r, Fraction(1), None, rng.random() < 0.5, "no_capacity", now)
        got = alloc._held_nodes(now, newcomer)
        assert got == reference(now, newcomer)
        seen.add(got)
    assert len(seen) > 2  # the cases differ: none, some and other nodes held back

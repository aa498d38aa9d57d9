"""A long-waiting training takes smaller borrowed trainings on the node held for it
(``workloads.waiter_preemption_rank``, ``Allocator.holds``, ``reclaimable_for(node=)``): the
pure rule, the class option, and the allocator's choice."""

from __future__ import annotations

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.decisions import Lease
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.workloads import (
    DEFAULT_CLASSES,
    Holder,
    WorkloadClass,
    parse_classes,
    preemption_rank,
    waiter_preemption_rank,
)
from tests.allocrig import granted, h100_node, offers, queued, req

INTERACTIVE, TRAINING, INFERENCE = (DEFAULT_CLASSES[k] for k in DEFAULT_CLASSES)
X4 = {"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"]}


def holder(lid: str, cls=TRAINING, borrowed=True, granted_at=0.0, units=1, **kw) -> Holder:
    return Holder(lid, cls, borrowed, granted_at, units=Fraction(units), **kw)


def test_the_option_defaults_on_for_training_and_can_be_turned_off():
    classes = parse_classes(None)
    assert [c.preempt_for_waiters for c in classes.values()] == [False, True, False]
    off = parse_classes({"training": {"preempt_for_waiters": False}})
    assert not off["training"].preempt_for_waiters and off["training"].preemptible
    assert not parse_classes({"batch": {"preemptible": True}})["batch"].preempt_for_waiters
    with pytest.raises(ConfigError) as err:
        parse_classes({"training": {"preempt_for_waiters": "yes"}})
    assert err.value.field == "classes.'training'.preempt_for_waiters"


def test_a_long_waiter_takes_only_smaller_borrowed_preemptible_leases_youngest_first():
    eight = Fraction(8)
    ranks = {
        h.id: waiter_preemption_rank(h, TRAINING, eight, 100.0)
        for h in (
            holder("old", granted_at=1),
            holder("young", granted_at=9, units=4),
            holder("leaving", granted_at=1, leaving=True),
            holder("within", borrowed=False),  # within its owner's guarantee
            holder("as-large", units=8),  # could take the waiter back: never
            holder("nb", INTERACTIVE),
            holder("serve", INFERENCE),
        )
    }
    assert {k for k, r in ranks.items() if r is None} == {"within", "as-large", "nb", "serve"}
    order = sorted((r, k) for k, r in ranks.items() if r is not None)
    assert [k for _, k in order] == ["leaving", "young", "old"]
    # a higher preemptible class is never taken; a class without the option takes nothing
    urgent = WorkloadClass("urgent", 60, preemptible=True)
    assert waiter_preemption_rank(holder("u", urgent), TRAINING, eight, 0) is None
    assert waiter_preemption_rank(holder("t"), urgent, eight, 0) is None
    off = parse_classes({"training": {"preempt_for_waiters": False}})["training"]
    assert waiter_preemption_rank(holder("t"), off, eight, 0) is None
    # the within-guarantee rule is unchanged: a training request still takes nothing there
    assert preemption_rank(holder("t"), TRAINING, 0) is None


def two_nodes(trainer_guarantee: int = 0) -> Allocator:
    """Nodes ``a`` and ``b`` of four H100s; ``nb`` is guaranteed one GPU, ``trainer``
    ``trainer_guarantee``; a long waiter after 100 s."""
    quotas = QuotaBook(
        users={
            "nb": QuotaSpec(guarantee=Fraction(1)),
            "trainer": QuotaSpec(guarantee=Fraction(trainer_guarantee)),
        }
    )
    return Allocator(
        [h100_node("a", 4), h100_node("b", 4)],
        offers(X4),
        quotas,
        aging_interval=0,
        reserve_after=100,
    )


def fill(alloc: Allocator) -> None:
    """a: a notebook within guarantee and three trainings, full; b: three 1-GPU trainings
    (t1 oldest, t3 youngest), one GPU free (placement packs a first)."""
    trainings = [(f"a{i}", "trainer") for i in range(3)] + [(f"t{i}", "trainer") for i in (1, 2, 3)]
    for n, (rid, user) in enumerate([("nb", "nb"), *trainings]):
        granted(alloc.submit(req(rid, "h100", user, arrival=float(n)), float(n)))
    on_b = sorted(le.id for le in alloc.leases.values() if le.node == "b")
    assert on_b == ["t1", "t2", "t3"] and alloc.leases["nb"].node == "a"


def rank_for(units: int):
    def rank(lease: Lease):
        h = Holder(lease.id, TRAINING, lease.borrowed, lease.request.arrival, units=lease.units)
        if lease.request.user == "nb":
            h = Holder(lease.id, INTERACTIVE, lease.borrowed, 0.0, units=lease.units)
        return waiter_preemption_rank(h, TRAINING, Fraction(units), 0)

    return rank


def test_the_held_node_gives_up_the_youngest_trainings_it_needs_and_no_more():
    alloc = two_nodes()
    fill(alloc)
    pair = req("pair", "h100x2", "trainer", arrival=10.0)
    queued(alloc.submit(pair, 10))
    assert alloc.holds(50) == {}  # not a long waiter yet: nothing held, nothing taken
    # the node with trainings only (nothing pinned), not the notebook's
    assert alloc.holds(200) == {"pair": "b"}
    # one GPU free there: the youngest of the three is enough
    assert alloc.reclaimable_for(pair, 200, rank_for(2), "b") == ["t3"]
    # a 4-GPU waiter needs all three, youngest first; the notebook's node gives nothing (its
    # notebook stays, so no preemption there would make it fit)
    quad = req("quad", "h100x4", "trainer", arrival=10.0)
    assert alloc.reclaimable_for(quad, 200, rank_for(4), "b") == ["t3", "t2", "t1"]
    assert alloc.reclaimable_for(quad, 200, rank_for(4), "a") == []
    # deciding changed nothing: the leases are where they were
    assert sorted(le.id for le in alloc.leases.values() if le.node == "b") == ["t1", "t2", "t3"]


def test_leases_within_guarantee_are_never_taken():
    alloc = two_nodes(trainer_guarantee=8)  # every training within its owner's guarantee
    fill(alloc)
    pair = req("pair", "h100x2", "trainer", arrival=10.0)
    queued(alloc.submit(pair, 10))
    assert alloc.holds(200) == {"pair": "b"}
    assert not any(le.borrowed for le in alloc.leases.values())
    assert alloc.reclaimable_for(pair, 200, rank_for(2), "b") == []

"""The starvation guard holds one node, not every GPU of a model (``pool.reservation``): which
node a long waiter holds, and that everything behind it may use the rest of the pool."""

from __future__ import annotations

from fractions import Fraction

from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.model import Node
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.reservation import (
    node_to_hold,
    pinned_units,
    smaller_borrowed_units,
    usable,
)
from tests.allocrig import granted, h100_node, mig_node, offers, queued, req

OFFERS = {o.name: o for o in offers()}


def two_nodes() -> Allocator:
    """Nodes ``a`` then ``b`` of two H100s; ``pin`` is guaranteed 2 GPUs, ``borrow`` none."""
    quotas = QuotaBook(
        users={"pin": QuotaSpec(guarantee=Fraction(2)), "borrow": QuotaSpec(guarantee=Fraction(0))}
    )
    return Allocator(
        [h100_node("a", 2), h100_node("b", 2)],
        offers(),
        quotas,
        aging_interval=0,
        reserve_after=100,
    )


def test_a_long_waiter_holds_one_node_and_the_rest_stays_in_use():
    alloc = two_nodes()
    assert granted(alloc.submit(req("soft", "h100", "borrow"), 0)).node == "a"
    assert granted(alloc.submit(req("soft-2", "h100", "borrow"), 0)).node == "a"
    assert alloc.leases["soft"].borrowed
    assert granted(alloc.submit(req("firm", "h100", "pin"), 0)).node == "b"
    alloc.release("soft-2", 0)  # a: one borrowed lease, b: one within guarantee
    queued(alloc.submit(req("pair", "h100x2", "patient"), 0))
    # past reserve_after the pair holds node a (nothing pinned there: its lease is borrowed),
    # so a newcomer goes to the free GPU of b instead of waiting behind the pair, as it did
    # when the pair held every H100 back
    single = granted(alloc.submit(req("single", "h100", "x"), 200))
    assert single.node == "b"
    # the held node takes nothing new...
    alloc.release("single", 210)
    assert granted(alloc.submit(req("single-2", "h100", "y"), 220)).node == "b"
    assert queued(alloc.submit(req("single-3", "h100", "z"), 230)).reason == "fairness"
    # ...until the pair fits there: it is served first
    grants = alloc.release("soft", 240)
    assert [g.request.id for g in grants] == ["pair"]
    assert grants[0].node == "a"
    assert alloc.position("single-3", 240) == 1


def test_below_reserve_after_nothing_is_held():
    alloc = two_nodes()
    granted(alloc.submit(req("soft", "h100", "borrow"), 0))
    granted(alloc.submit(req("soft-2", "h100", "borrow"), 0))
    granted(alloc.submit(req("firm", "h100", "pin"), 0))
    alloc.release("soft-2", 0)
    queued(alloc.submit(req("pair", "h100x2", "patient"), 0))
    # FGD's choice stands (the nodes tie): the first node in order
    assert granted(alloc.submit(req("single", "h100", "x"), 50)).node == "a"


def hold(alloc: Allocator, offer: str, pinned=None, **kw) -> str | None:
    o = OFFERS[offer]
    nodes = [(n, usable(n.signature(), o)) for n in alloc.nodes.values()]
    where = pinned_units(alloc.leases.values()) if pinned is None else pinned
    return node_to_hold(nodes, where, **kw)


def test_the_held_node_is_the_one_least_pinned_then_most_free():
    alloc = two_nodes()
    assert granted(alloc.submit(req("soft-1", "h100", "borrow"), 0)).node == "a"
    assert granted(alloc.submit(req("soft-2", "h100", "borrow"), 0)).node == "a"
    assert granted(alloc.submit(req("firm", "h100", "pin"), 0)).node == "b"
    # a is full but only of borrowed leases (they go back on reclaim), b's lease stays
    assert pinned_units(alloc.leases.values()) == {"b": 1.0}
    assert usable(alloc.nodes["a"].signature(), OFFERS["h100x2"]) == 0.0
    assert usable(alloc.nodes["b"].signature(), OFFERS["h100x2"]) == 1.0
    assert hold(alloc, "h100x2") == "a"
    # were every lease pinned, the least pinned would decide; were none, the most free
    assert hold(alloc, "h100x2", {"a": 2.0, "b": 1.0}) == "b"
    assert hold(alloc, "h100x2", {}) == "b"
    assert hold(alloc, "h100x2", taken={"a"}) == "b"
    assert hold(alloc, "h100x2", clusters={"elsewhere"}) is None


def test_nodes_that_could_never_serve_the_request_are_never_held():
    small, mig = h100_node("small", 1), mig_node()
    cordoned = h100_node("off", 4, cordoned=True)
    assert usable(small.signature(), OFFERS["h100x2"]) is None  # one GPU, asks two
    assert usable(mig.signature(), OFFERS["h100"]) is None  # MIG mode, not whole GPUs
    assert usable(mig.signature(), OFFERS["shared"]) is None
    assert usable(mig.signature(), OFFERS["a100-1g"]) == 2.0
    nodes: list[Node] = [small, mig]
    for offer, want in (("h100x2", None), ("a100-1g", "mig")):
        o = OFFERS[offer]
        assert node_to_hold([(n, usable(n.signature(), o)) for n in nodes], {}) == want
    # the allocator offers only schedulable nodes, in node order
    alloc = Allocator([cordoned, h100_node("on", 2), mig], offers())
    assert [(n.name, f) for n, f in alloc._usable(OFFERS["h100"])] == [("on", 2.0), ("mig", None)]
    # equal keys: node order decides
    p, q = h100_node("p"), h100_node("q")
    assert node_to_hold([(p, 4.0), (q, 4.0)], {}) == "p"


def test_of_nodes_equally_pinned_the_one_a_long_waiter_could_take_back_is_held():
    # a: one borrowed 2-GPU lease; b: two borrowed 1-GPU leases; both full, nothing pinned.
    # For a pair, b's leases are smaller than it asks (a long training may preempt them there,
    # workloads.waiter_preemption_rank), a's is not: b is held, though a comes first in order
    alloc = two_nodes()
    assert granted(alloc.submit(req("big", "h100x2", "borrow"), 0)).node == "a"
    for rid in ("s1", "s2"):
        assert granted(alloc.submit(req(rid, "h100", "borrow"), 0)).node == "b"
    queued(alloc.submit(req("pair", "h100x2", "borrow"), 0))
    leases = alloc.leases.values()
    assert smaller_borrowed_units(leases, Fraction(2)) == {"b": 2.0}
    assert smaller_borrowed_units(leases, Fraction(3)) == {"a": 2.0, "b": 2.0}
    assert smaller_borrowed_units(leases, Fraction(3), {"a"}) == {"a": 2.0}
    assert hold(alloc, "h100x2") == "a"  # without it: equal keys, node order

    def small(names):
        return smaller_borrowed_units(leases, Fraction(2), names)

    assert hold(alloc, "h100x2", takeable=small) == "b"
    assert alloc.holds(200) == {"pair": "b"}
    # pinned capacity still comes first
    assert hold(alloc, "h100x2", {"b": 1.0}, takeable=small) == "a"

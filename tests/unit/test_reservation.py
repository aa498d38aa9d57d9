"""The starvation guard holds one node, not every GPU of a model (``pool.reservation``): which
node a long waiter holds, and that everything behind it may use the rest of the pool."""

from __future__ import annotations

from fractions import Fraction

from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.model import Node
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec
from jupyterhub_gpupool.pool.reservation import hold_key, node_to_hold
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


def test_the_held_node_is_the_one_fewest_pinned_then_most_free():
    alloc = two_nodes()
    assert granted(alloc.submit(req("soft-1", "h100", "borrow"), 0)).node == "a"
    assert granted(alloc.submit(req("soft-2", "h100", "borrow"), 0)).node == "a"
    assert granted(alloc.submit(req("firm", "h100", "pin"), 0)).node == "b"
    nodes, pair = alloc.nodes, OFFERS["h100x2"]
    a_key = hold_key(nodes["a"], pair, alloc._borrowed)
    b_key = hold_key(nodes["b"], pair, alloc._borrowed)
    # a is full but only of borrowed leases (they go back on reclaim), b's lease stays
    assert a_key == (0, -0.0) and b_key == (1, -1.0)
    assert node_to_hold(nodes.values(), pair, alloc._borrowed) == "a"
    # were every lease pinned, the fewest pinned, then the most free capacity would decide
    assert node_to_hold(nodes.values(), pair, lambda lid: False) == "b"
    # and were none pinned, the most free capacity
    assert node_to_hold(nodes.values(), pair, lambda lid: True) == "b"
    assert node_to_hold(nodes.values(), pair, alloc._borrowed, taken={"a"}) == "b"
    assert node_to_hold(nodes.values(), pair, alloc._borrowed, clusters={"elsewhere"}) is None


def test_nodes_that_could_never_serve_the_request_are_never_held():
    small = h100_node("small", 1)
    mig = mig_node()
    cordoned = h100_node("off", 4, cordoned=True)
    nodes: list[Node] = [small, mig, cordoned]
    assert hold_key(small, OFFERS["h100x2"], lambda lid: True) is None  # one GPU, asks two
    assert hold_key(mig, OFFERS["h100"], lambda lid: True) is None  # MIG mode, not whole GPUs
    assert hold_key(cordoned, OFFERS["h100"], lambda lid: True) is None
    assert node_to_hold(nodes, OFFERS["h100x2"], lambda lid: True) is None
    assert node_to_hold(nodes, OFFERS["a100-1g"], lambda lid: True) == "mig"
    # equal keys: node order decides
    assert node_to_hold([h100_node("p"), h100_node("q")], OFFERS["h100"], bool) == "p"

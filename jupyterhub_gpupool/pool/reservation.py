"""Which node a long waiter holds back: the starvation guard, one node at a time.

A request that has waited ``reserve_after`` seconds for capacity must not be overtaken forever
by smaller asks that keep filling every gap. Holding back *every* GPU of its models does that,
but it idles them all: in the mixed-pool replay a waiting 8-GPU training kept 15-30 free GPUs
from every smaller job for hours, because the notebooks beside them never left and no node came
free (``benchmarks/mixed_pool.py``). So a long waiter holds one node instead, as YARN's
capacity scheduler reserves a node for a container that does not fit: nothing new goes there,
and everything behind it may use the rest of the pool (backfill).

The node held is the one most likely to come free for it: among the nodes that could ever hold
the request, the fewest GPUs pinned by a lease within guarantee (a borrowed lease goes back on
reclaim or preemption, one within guarantee only when its owner lets go), then the most free
capacity on the GPUs it could use, then node order. It is chosen again at every decision from
the current state: nothing new lands on it, so its own key only improves until the request
fits, and another node takes over only when it is strictly closer, so the waiter is never
starved as long as the leases it waits for end — the guarantee holding every GPU back gave.

Only the first long waiter (in queue order) for a set of models holds a node; later long
waiters for the same models wait behind it without holding more, as they did before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Set

from .model import Gpu, Node, Offer

#: A node's closeness to fitting a request: (GPUs pinned, −free units); smaller is closer.
HoldKey = tuple[int, float]


def serves(gpu: Gpu, offer: Offer) -> bool:
    """Whether ``gpu`` could ever hold (part of) one grant of ``offer``, were it empty."""
    if not gpu.schedulable or not offer.allows_model(gpu.model.name):
        return False
    if offer.kind == "mig":
        return gpu.mig_enabled and offer.profile in gpu.model.profiles
    if gpu.mig_enabled:
        return False
    if offer.kind == "gpu":
        return gpu.sharing != "shared"
    return offer.kind == "shared" and gpu.sharing != "exclusive"


def holders(gpu: Gpu) -> set[str]:
    """Lease ids (and the pool's markers) holding any part of ``gpu``."""
    out = set(gpu.shares)
    if gpu.whole_lease is not None:
        out.add(gpu.whole_lease)
    out |= {i.lease for i in gpu.instances if i.lease is not None}
    return out


def hold_key(node: Node, offer: Offer, borrowed: Callable[[str], bool]) -> HoldKey | None:
    """How close ``node`` is to fitting ``offer``: GPUs it could use that a lease not
    ``borrowed`` holds (pinned), then their free units, negated; None where it never could
    (unschedulable, or fewer usable GPUs than the offer's count)."""
    if not node.schedulable:
        return None
    usable = [g for g in node.gpus if serves(g, offer)]
    if len(usable) < (offer.count if offer.kind == "gpu" else 1):
        return None
    pinned = sum(1 for g in usable if any(not borrowed(h) for h in holders(g)))
    return pinned, -sum(g.free_units() for g in usable)


def claim_models(covered: set[str], offer: Offer) -> bool:
    """Whether a long waiter for ``offer`` holds a node: not when a waiter ahead holds one for
    any of its models (``covered``, ``*`` for any model), which it then adds to ``covered``."""
    models = set(offer.models) or {"*"}
    if covered and ("*" in covered or "*" in models or covered & models):
        return False
    covered |= models
    return True


def node_to_hold(
    nodes: Iterable[Node],
    offer: Offer,
    borrowed: Callable[[str], bool],
    clusters: Set[str] | None = None,
    taken: Set[str] = frozenset(),
) -> str | None:
    """The node a long waiter for ``offer`` holds: the smallest :func:`hold_key` among
    ``nodes`` (in node order; the first wins a tie), in ``clusters`` when given, not one of
    ``taken`` (held for a waiter ahead). None when no node could ever serve it."""
    best: tuple[HoldKey, str] | None = None
    for node in nodes:
        if node.name in taken or (clusters is not None and node.cluster not in clusters):
            continue
        key = hold_key(node, offer, borrowed)
        if key is not None and (best is None or key < best[0]):
            best = (key, node.name)
    return None if best is None else best[1]

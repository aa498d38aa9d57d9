"""Which node a long waiter holds back: the starvation guard, one node at a time.

A request that has waited ``reserve_after`` seconds for capacity must not be overtaken forever
by smaller asks that keep filling every gap. Holding back *every* GPU of its models does that,
but it idles them all: in the mixed-pool replay a waiting 8-GPU training kept 15-30 free GPUs
from every smaller job for hours, because the notebooks beside them never left and no node came
free (``benchmarks/mixed_pool.py``). So a long waiter holds one node instead, as YARN's
capacity scheduler reserves a node for a container that does not fit: nothing new goes there,
and everything behind it may use the rest of the pool (backfill).

The node held is the one most likely to come free for it: among the nodes that could ever hold
the request, the least capacity held by leases within guarantee (*pinned*: a borrowed lease
goes back on reclaim or preemption, one within guarantee only when its owner lets go), then the
most capacity free or held by borrowed leases smaller than it asks (what a long waiter of a
class with ``preempt_for_waiters`` may preempt there, ``workloads.waiter_preemption_rank``: in
the mixed replay, of two nodes each full of borrowed trainings the one with two 4-GPU jobs, not
the one with an 8-GPU job, is held for an 8-GPU waiter), then the most free capacity on the
GPUs it could use, then node order. Once the ``PreemptJobs`` round has said which
(``effects.NodeHeld``, remembered as ``Waiter.hold``) the node is kept until the waiter is
granted or gone, or can no longer be served there (``headroom.kept_hold``: drained, lost, too
few usable GPUs, outside its clusters, held for a waiter ahead, or another node is less
pinned); only then is one chosen afresh. Nothing new lands on it, so it only comes closer to
fitting the request, and the waiter is never starved as long as the leases it waits for end —
the guarantee holding every GPU back gave. (Chosen afresh at every decision, a node a refill of
the headroom freed GPUs on could take the hold over and call for another refill:
``pool.headroom``.)

Only the first long waiter (in queue order) for a set of models holds a node; later long
waiters for the same models wait behind it without holding more, as they did before.

Cost: one pass over the leases (pinned capacity per node), one over the schedulable nodes (whose
usable GPUs and free capacity are read from their state, ``Node.signature``, and cached per
state and offer), and where several nodes are least pinned a pass over the leases that looks
closer only at those nodes' leases; only while a long waiter is queued (at 10,000 GPUs with one
waiting: 2.6 ms a decision against 2.3-2.5 ms before the last pass).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Set
from fractions import Fraction

from .catalog import GpuModel
from .decisions import Lease
from .model import Node, Offer, Signature, StateKey
from .placement import key_free

#: A node's closeness to fitting a request: (pinned units, −(free + smaller borrowed units),
#: −free units); smaller is closer.
HoldKey = tuple[float, float, float]


def serves(key: StateKey, offer: Offer) -> bool:
    """Whether a GPU in state ``key`` could ever hold (part of) a grant of ``offer``, were it
    empty (``("x",)``: not schedulable)."""
    if key[0] == "x":
        return False
    model: GpuModel = key[1]
    if not offer.allows_model(model.name):
        return False
    if offer.kind == "mig":
        return key[0] == "m" and offer.profile in model.profiles
    sharing: str = key[2]
    if key[0] != "n":
        return False
    if offer.kind == "gpu":
        return sharing != "shared"
    return offer.kind == "shared" and sharing != "exclusive"


def usable(sig: Signature, offer: Offer) -> float | None:
    """Free capacity of the GPUs of a node state that could serve ``offer`` (placement's
    measure, ``placement.key_free``); None when fewer of them than one grant needs."""
    keys = [k for k in sig if serves(k, offer)]
    if len(keys) < (offer.count if offer.kind == "gpu" else 1):
        return None
    return sum(key_free(k) for k in keys)


def pinned_units(leases: Iterable[Lease]) -> dict[str, float]:
    """Per node, the units held by leases within guarantee (not borrowed)."""
    out: dict[str, float] = {}
    for lease in leases:
        if not lease.borrowed and lease.node:
            out[lease.node] = out.get(lease.node, 0.0) + float(lease.units)
    return out


def smaller_borrowed_units(
    leases: Iterable[Lease], units: Fraction, nodes: Set[str] | None = None
) -> dict[str, float]:
    """Per node (of ``nodes`` when given), the units held by borrowed leases each smaller than
    ``units``: what a long waiter for ``units`` could preempt there
    (``workloads.waiter_preemption_rank``)."""
    out: dict[str, float] = {}
    for lease in leases:
        node = lease.node
        if lease.borrowed and node and (nodes is None or node in nodes) and lease.units < units:
            out[node] = out.get(node, 0.0) + float(lease.units)
    return out


def claim_models(covered: set[str], offer: Offer) -> bool:
    """Whether a long waiter for ``offer`` holds a node: not when a waiter ahead holds one for
    any of its models (``covered``, ``*`` for any model), which it then adds to ``covered``."""
    models = set(offer.models) or {"*"}
    if covered and ("*" in covered or "*" in models or covered & models):
        return False
    covered |= models
    return True


def node_to_hold(
    nodes: Iterable[tuple[Node, float | None]],
    pinned: Mapping[str, float],
    clusters: Set[str] | None = None,
    taken: Set[str] = frozenset(),
    takeable: Callable[[Set[str]], Mapping[str, float]] | None = None,
) -> str | None:
    """The node a long waiter holds: among ``nodes`` (each with its :func:`usable` free
    capacity for the request, in node order; the first wins a tie) the smallest
    (``pinned`` units, −(free + ``takeable`` units), −free), in ``clusters`` when given, not
    one of ``taken`` (held for a waiter ahead). None when no node could ever serve it.

    ``takeable(names)``: the units per node of ``names`` a long waiter could take back
    (:func:`smaller_borrowed_units`); asked only for the nodes least pinned, so its pass over
    the leases is cheap where few nodes tie."""
    least: list[tuple[str, float]] = []
    low = math.inf
    for node, free in nodes:
        if free is None or node.name in taken:
            continue
        if clusters is not None and node.cluster not in clusters:
            continue
        p = pinned.get(node.name, 0.0)
        if p < low:
            low, least = p, [(node.name, free)]
        elif p == low:
            least.append((node.name, free))
    if not least:
        return None
    extra = takeable({n for n, _ in least}) if takeable is not None and len(least) > 1 else {}
    best: tuple[HoldKey, str] | None = None
    for name, free in least:
        key = (low, -(free + extra.get(name, 0.0)), -free)
        if best is None or key < best[0]:
            best = (key, name)
    return None if best is None else best[1]

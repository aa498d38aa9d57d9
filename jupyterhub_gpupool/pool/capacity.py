"""GPU units and what is free of them: what a grant costs (``units_for``), the free units per
GPU model (the capacity views the admin pages and metrics read, and the headroom's count), and
the headroom's placement rule (``pool.headroom``: a borrowed grant of a preemptible class
leaves each model's ``keep_free`` units free).

``Capacity`` is a base of ``Allocator`` (over ``scoring.NodeStates``, the node-state index it
places with); the allocator keeps the inventory (``gpus``), the leases and the queue.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from fractions import Fraction
from typing import TypedDict

from .headroom import Headroom, free_by_model, wait_message
from .model import Gpu, Node, Offer, Request, offer_units
from .placement import NodeChoice
from .scoring import NodeStates

#: The headroom's count: free units per GPU model, and the nodes held for long waiters it
#: leaves out (``Allocator.headroom_free``).
HeadroomCount = tuple[Mapping[str, float], frozenset[str]]


class ModelCapacity(TypedDict):
    """One GPU model's line of :meth:`Allocator.capacity_by_model`."""

    model: str
    gpus: int
    free_units: float


class Capacity(NodeStates):
    """Units, free capacity and the headroom over the node-state index (a base of
    ``Allocator``, which holds ``gpus`` and sets ``headroom``)."""

    gpus: dict[str, Gpu]
    #: GPUs kept from borrowing by preemptible classes (``pool.headroom``; None: none).
    headroom: Headroom | None = None

    def units_for(self, offer: Offer, node: Node | None) -> Fraction:
        """GPU units one grant of ``offer`` costs (on ``node``, else the cheapest model)."""
        if node is not None and node.gpus:
            model = node.gpus[0].model
            for g in node.gpus:
                if offer.allows_model(g.model.name):
                    model = g.model
                    break
            return offer_units(offer, model)
        models = [
            g.model
            for g in self.gpus.values()
            if offer.allows_model(g.model.name) and (offer.kind != "mig" or g.mig_enabled)
        ]
        return min((offer_units(offer, m) for m in models), default=Fraction(0))

    # -- views -----------------------------------------------------------------------------

    def capacity_by_model(self) -> dict[str, ModelCapacity]:
        """Per GPU model: how many GPUs exist and their free units (0 where nothing new may go)."""
        out: dict[str, ModelCapacity] = {}
        for node in self.nodes.values():
            for g in node.gpus:
                m = out.setdefault(
                    g.model.name, ModelCapacity(model=g.model.name, gpus=0, free_units=0.0)
                )
                m["gpus"] += 1
                m["free_units"] += g.free_units() if node.schedulable else 0.0
        return out

    def capacity(self) -> Mapping[str, float]:
        """Total and free GPU units of schedulable hardware."""
        total = free = 0.0
        for node in self.nodes.values():
            for g in node.gpus:
                if g.schedulable and node.schedulable:
                    total += 1.0
                    free += g.free_units()
        return {"total": total, "free": free, "used": total - free}

    def free_by_model(self, held: Collection[str] = ()) -> dict[str, float]:
        """Free units per GPU model of schedulable nodes (one node of each state counted),
        less those of the ``held`` nodes (the headroom's count: ``Allocator.headroom_free``)."""
        groups = self._groups
        return free_by_model(
            ((self.nodes[self._group_first(s)[1]], len(groups[s])) for s in groups),
            [self.nodes[n] for n in held if n in self.nodes],
        )

    def _held_back_on(
        self, request: Request, borrowed: bool, offer: Offer, node: Node, count: HeadroomCount
    ) -> str | None:
        """The GPU model a grant of ``offer`` on ``node`` would leave short of its headroom,
        or None (also when the rule does not apply to ``request``, and on a node held for a
        long waiter: what is free there is no headroom). ``count``: the headroom's free units
        per model and the held nodes they leave out."""
        h = self.headroom
        free, held = count
        if h is None or not h.held_back(request.workload, borrowed) or node.name in held:
            return None
        model = next((g.model.name for g in node.gpus if offer.allows_model(g.model.name)), "")
        return model if h.breached(free, model, self.units_for(offer, node)) else None

    def _headroom_place(
        self,
        request: Request,
        borrowed: bool,
        offer: Offer,
        placed: tuple[Node, NodeChoice],
        exclude: frozenset[str],
        clusters: frozenset[str] | None,
        count: Callable[[], HeadroomCount],
    ) -> tuple[tuple[Node, NodeChoice] | None, str]:
        """``placed``, or a node of another model the offer allows that the grant leaves
        enough of (or a node held for a long waiter, whose free units are no headroom), or
        (None, why it waits): a borrowed grant of a preemptible class leaves each model's
        ``keep_free`` units free. ``count``: the headroom's count (asked only when the rule
        applies)."""
        h = self.headroom
        if h is None or not h.held_back(request.workload, borrowed):
            return placed, ""
        counted = count()
        free, held = counted
        full: set[str] = set()
        while (
            model := self._held_back_on(request, borrowed, offer, placed[0], counted)
        ) is not None:
            full.add(model)
            why = wait_message(model, h.keep(model))
            if not held and all(m in full for m in free if offer.allows_model(m)):
                return None, why
            exclude |= {
                n
                for n, x in self.nodes.items()
                if n not in held and any(g.model.name in full for g in x.gpus)
            }
            found = self._place(offer, exclude, clusters)
            if found is None:
                return None, why
            placed = found
        return placed, ""

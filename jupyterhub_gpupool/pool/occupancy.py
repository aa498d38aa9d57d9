"""Who holds which device: a lease's slots taken and given back (``_occupy``, ``_vacate``:
the GPUs, shares and MIG instances, the node's CPU and memory, the node re-indexed), the devices
that pods the pool did not place hold (``set_outside``, ``rebind``), and ``available``, the
probe that places and undoes.

``Occupancy`` is a base of ``Allocator`` (over ``capacity.Capacity`` and the node-state index);
the allocator keeps the offers, the leases, the quotas and the queue, and decides.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import replace
from fractions import Fraction

from .capacity import Capacity
from .decisions import Lease
from .model import RETIRING, MigInstance, Offer, Request
from .outside import OUTSIDE, OutsideHolds, Rebinding
from .placement import slots_for
from .workloads import replicas_of


class Occupancy(Capacity):
    """The occupancy primitives and the placing probe (a base of ``Allocator``, which holds
    ``offers`` and ``leases``)."""

    offers: dict[str, Offer]
    leases: dict[str, Lease]

    def _offer_of(self, request: Request) -> Offer | None:
        """The offer ``request`` asks for, times its replicas (``workloads.replicas_of``)."""
        offer = self.offers.get(request.offer)
        if offer is None or request.replicas == 1:
            return offer
        return replicas_of(offer, request.replicas)

    def _occupy(self, lease: Lease) -> None:
        for slot in lease.slots:
            gpu = self.gpus[slot.gpu]
            if slot.kind == "gpu":
                gpu.whole_lease = lease.id
            elif slot.kind == "shared":
                gpu.shares[lease.id] = slot.milli
            else:
                inst = next(
                    (
                        i
                        for i in gpu.instances
                        if i.start == slot.start
                        and i.profile == slot.profile
                        and i.lease != RETIRING
                    ),
                    None,
                )
                if inst is None:
                    inst = MigInstance(slot.profile or "", slot.start or 0)
                    gpu.instances.append(inst)
                inst.lease = lease.id
        if lease.node:
            node = self.nodes[lease.node]
            offer = self._offer_of(lease.request)
            if offer is not None:
                node.cpu_used += offer.cpu_milli
                node.memory_used += offer.memory_mib
            self._reindex(node)

    def _vacate(self, lease: Lease, retire: bool = False) -> None:
        """Free what ``lease`` holds. With ``retire`` (a real release, not a probe), an instance
        the pool made for it that the node already has stays occupied (``RETIRING``) until
        the node reports it destroyed: nothing may be planned over it before."""
        for slot in lease.slots:
            gpu = self.gpus[slot.gpu]
            if slot.kind == "gpu" and gpu.whole_lease == lease.id:
                gpu.whole_lease = None
            elif slot.kind == "shared":
                gpu.shares.pop(lease.id, None)
            elif slot.create:
                # the pool made this instance for the lease; it goes with it
                for inst in [i for i in gpu.instances if i.lease == lease.id]:
                    if retire and inst.uuid is not None:
                        inst.lease = RETIRING
                    else:
                        gpu.instances.remove(inst)
            else:
                for inst in gpu.instances:
                    if inst.lease == lease.id:
                        inst.lease = None
        if lease.node:
            node = self.nodes[lease.node]
            offer = self._offer_of(lease.request)
            if offer is not None:
                node.cpu_used = max(0, node.cpu_used - offer.cpu_milli)
                node.memory_used = max(0, node.memory_used - offer.memory_mib)
            self._reindex(node)

    def set_outside(self, name: str, holds: OutsideHolds) -> None:
        """Mark the devices of node ``name`` that pods the pool did not place hold
        (``pool.outside.place_outside`` or ``mark_exact`` chose them): they take nothing new."""
        node = self.nodes[name]
        gpus, instances = set(holds.gpus), set(holds.instances)
        for g in node.gpus:
            g.outside = g.uuid in gpus and g.whole_lease is None and not g.shares
            g.outside_by = holds.holders_of(g.uuid)
            for i in g.instances:
                if i.lease == OUTSIDE:
                    i.lease = None
                if i.lease is None and (g.uuid, i.start) in instances:
                    i.lease = OUTSIDE
        self._reindex(node)

    def rebind(self, lease_id: str, rebinding: Rebinding, node: str) -> None:
        """Apply ``pool.outside.rebind``'s outcome: the lease (and the leases it swaps with)
        hold the devices their pods really got; the node's outside marks follow."""
        moving = {lease_id: rebinding.slots, **rebinding.others}
        leases = [self.leases[lid] for lid in moving]
        for lease in leases:
            lease.slots = tuple(replace(s, create=False) for s in lease.slots)
            self._vacate(lease)
        self.set_outside(node, OutsideHolds())
        for lease in leases:
            lease.slots = tuple(moving[lease.id])
            self._occupy(lease)
        self.set_outside(node, rebinding.outside)

    def available(self, offer: Offer, cap: int = 99, clusters: Iterable[str] = ()) -> int:
        """How many grants of ``offer`` fit right now (at most ``cap``), ignoring quotas, for
        a hub launching into ``clusters`` (empty: any).

        Counted by placing and then undoing, so it follows every placement rule exactly.
        """
        if offer.kind == "cpu":
            return cap
        where = offer.served_in(clusters)
        if where is not None and not where:
            return 0
        placed: list[Lease] = []
        try:
            while len(placed) < cap:
                found = self._place(offer, clusters=where)
                if found is None:
                    break
                node, choice = found
                lease = Lease(
                    f"~probe{len(placed)}",
                    Request(f"~probe{len(placed)}", "~", offer.name),
                    offer.name,
                    node.name,
                    slots_for(node, self.shape_of(offer), choice),
                    Fraction(0),
                    None,
                    False,
                )
                self._occupy(lease)
                placed.append(lease)
            return len(placed)
        finally:
            for lease in reversed(placed):
                self._vacate(lease)

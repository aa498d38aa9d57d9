"""Changes played on the allocator and taken back: how ``decide`` sees what a release frees.

Who the queue serves after a release depends on what the release frees, so the decision needs
the pool as it will be. ``Trial`` plays releases and queue passes on the allocator with its own
primitives (the probe pattern ``Allocator.reclaimable_for`` and ``available`` use), notes the
grants, flag changes and waiters' reasons they make, and on exit restores everything it
touched: the GPUs and nodes (from a copy of their state taken before the first change), the
lease and waiter tables, the quota tallies, the borrowed flags and the waiters' reasons. With
nobody waiting, a release leaves the devices as they are (nothing will be placed on them). The
demand counts are never touched: the applier's ``Allocator.apply`` notes them, once, so the
grants of one queue pass are all placed with the demand weights it started with.

``alone`` says when ending a lease needs no trial at all (nobody waits, and no other lease's
borrowed flag can change): the release of a grant in a pool with no queue, the common case.
"""

from __future__ import annotations

from collections.abc import Callable
from types import TracebackType

from .allocator import Allocator
from .decisions import Grant, Lease
from .model import Gpu, MigInstance, Node
from .nodeput import put_back, put_node
from .outside import OutsideHolds
from .queue import Waiter

_GpuState = tuple[Gpu, list[MigInstance], list[str | None], str | None, dict[str, int]]


class Trial:
    """``with Trial(alloc) as trial: ...``: the allocator is as it was after the block."""

    def __init__(self, alloc: Allocator) -> None:
        self.alloc = alloc
        self.granted: set[str] = set()  # requests the trial's queue passes granted
        self.ended: set[str] = set()  # leases and requests the trial released
        self._gpus: dict[str, _GpuState] = {}
        self._nodes: dict[str, tuple[Node, int, int]] = {}
        self._undo: list[Callable[[], None]] = []
        self._reasons: dict[str, tuple[Waiter, str]] = {}
        #: False: a release serves nobody (the rule serves the queue later, once it changed
        #: the pool: an inventory's lost leases, before the node is put).
        self.serving = True

    def __enter__(self) -> Trial:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.undo()

    # -- what the trial does -------------------------------------------------------------------

    def release(self, lease_id: str, now: float) -> tuple[list[Grant], list[tuple[str, bool]]]:
        """End a lease or queued request as ``Allocator.release`` does: (the grants the queue
        gets, the (lease id, borrowed) flags that change)."""
        a = self.alloc
        self.ended.add(lease_id)
        flags: list[tuple[str, bool]] = []
        if lease_id in a.waiters:
            waiter = a.waiters[lease_id]
            self._undo.append(lambda: a.waiters.__setitem__(lease_id, waiter))
            a.drop(lease_id)
        elif lease_id in a.leases:
            lease = a.leases[lease_id]
            free = bool(a.waiters)  # nobody waiting (a trial adds none): nothing is placed
            if free:
                self._touch(lease)
            owners = a.drop(lease_id, free=free)
            self._undo.append(lambda: self._put_back(lease))
            assert owners is not None
            changed = a.rederive_borrowed(*owners)
            for le in changed:
                self._undo.append(_flip(le))
            flags = [(le.id, le.borrowed) for le in changed]
        return self.promote(now), flags

    def set_node_flags(self, name: str, cordoned: bool | None, draining: bool | None) -> None:
        """Cordon, uncordon or drain a node as ``Allocator.set_node_flags`` does."""
        a, node = self.alloc, self.alloc.nodes[name]
        was = node.cordoned, node.draining
        a.set_node_flags(name, cordoned=cordoned, draining=draining)

        def back() -> None:
            a.set_node_flags(name, cordoned=was[0], draining=was[1])

        self._undo.append(back)

    def set_gpu_sharing(self, uuid: str, sharing: str) -> None:
        """Set a GPU's sharing mode as ``Allocator.set_gpu_sharing`` does."""
        a, was = self.alloc, self.alloc.gpus[uuid].sharing

        def back() -> None:
            a.set_gpu_sharing(uuid, was)

        a.set_gpu_sharing(uuid, sharing)
        self._undo.append(back)

    def set_reachable(self, name: str, reachable: bool) -> None:
        """A node's agent reports again (or went silent), as the applier's ``NodeReachable``
        does."""
        a, node = self.alloc, self.alloc.nodes[name]
        was = node.unreachable
        node.unreachable = not reachable
        a.set_node_flags(name)

        def back() -> None:
            node.unreachable = was
            a.set_node_flags(name)

        self._undo.append(back)

    def set_outside(self, name: str, holds: OutsideHolds) -> None:
        """Mark a node's devices held outside as ``Allocator.set_outside`` does (its GPUs'
        instances come back with their copies; the marks on whole GPUs here)."""
        a, node = self.alloc, self.alloc.nodes[name]
        for g in node.gpus:
            self._touch_gpu(g.uuid)
        marks = [(g, g.outside, g.outside_by) for g in node.gpus]
        a.set_outside(name, holds)

        def back() -> None:
            for g, outside, by in marks:
                g.outside, g.outside_by = outside, by

        self._undo.append(back)

    def set_gpu_cordon(self, uuid: str, cordoned: bool) -> None:
        """Cordon a GPU (a re-partition waits on it), as the applier's ``GpuCordoned``."""
        a, gpu = self.alloc, self.alloc.gpus[uuid]
        was = gpu.cordoned
        gpu.cordoned = cordoned
        a.set_node_flags(gpu.node)

        def back() -> None:
            gpu.cordoned = was
            a.set_node_flags(gpu.node)

        self._undo.append(back)

    def set_instances(self, uuid: str, instances: list[MigInstance]) -> None:
        """Give a GPU a new MIG layout, as the applier's ``MigRowsSet`` does (its instances
        come back with their copy)."""
        a, gpu = self.alloc, self.alloc.gpus[uuid]
        self._touch_gpu(uuid)
        gpu.instances[:] = instances
        a.set_node_flags(gpu.node)

    def put_node(self, node: Node, outside: OutsideHolds) -> None:
        """Put ``node`` in place of the one of its name, as the applier's ``NodeReported``
        (``pool.nodeput.put_node``; the node it replaces comes back, untouched by it)."""
        a = self.alloc
        gpus = list(a.gpus.items())
        old = put_node(a, node, outside)
        self._undo.append(lambda: put_back(a, node.name, old, gpus))

    def promote(self, now: float) -> list[Grant]:
        """Serve the queue as ``Allocator.promote`` does (unless not ``serving``); returns
        the grants."""
        a = self.alloc
        if not self.serving or not a.waiters:
            return []
        for lid, waiter in a.waiters.items():
            self._reasons.setdefault(lid, (waiter, waiter.reason))
        grants = []
        while (grant := a.next_grant(now)) is not None:
            self._occupy(grant)
            grants.append(grant)
        return grants

    def grant(self, grant: Grant) -> None:
        """Place a new request's grant as ``Allocator.apply`` does (a round's shrink target:
        the next shrink of the round sees it)."""
        self._occupy(grant)

    def reasons(self) -> list[tuple[str, str]]:
        """(id, reason) of each waiter still waiting whose reason the trial changed."""
        waiters = self.alloc.waiters
        return [
            (lid, waiter.reason)
            for lid, (waiter, was) in self._reasons.items()
            if lid in waiters and waiter.reason != was
        ]

    # -- playing forward and back ----------------------------------------------------------------

    def _occupy(self, grant: Grant) -> None:
        a, lid = self.alloc, grant.request.id
        waiter = a.waiters.pop(lid, None)  # None: a new request's grant (``grant``)
        lease = Lease(
            lid,
            grant.request,
            grant.offer,
            grant.node,
            grant.slots,
            grant.units,
            grant.group,
            grant.borrowed,
        )
        self._touch(lease)
        a._occupy(lease)
        a.leases[lid] = lease
        a._index(lease)
        a.quotas.add(lease.request.user, lease.group, lease.units)
        self.granted.add(lid)

        def back() -> None:
            a.quotas.remove(lease.request.user, lease.group, lease.units)
            a._unindex(lease)
            del a.leases[lid]
            if waiter is not None:
                a.waiters[lid] = waiter

        self._undo.append(back)

    def _put_back(self, lease: Lease) -> None:
        """Undo ``Allocator.drop`` of ``lease`` (its devices come back with the GPUs' copies)."""
        a = self.alloc
        a.leases[lease.id] = lease
        a._index(lease)
        a.quotas.add(lease.request.user, lease.group, lease.units)

    def _touch(self, lease: Lease) -> None:
        """Copy the state of the GPUs and node ``lease`` holds before anything changes them."""
        a = self.alloc
        for slot in lease.slots:
            self._touch_gpu(slot.gpu)
        if lease.node and lease.node not in self._nodes:
            node = a.nodes[lease.node]
            self._nodes[lease.node] = (node, node.cpu_used, node.memory_used)

    def _touch_gpu(self, uuid: str) -> None:
        if uuid not in self._gpus:
            g = self.alloc.gpus[uuid]
            held = [i.lease for i in g.instances]
            self._gpus[uuid] = (g, list(g.instances), held, g.whole_lease, dict(g.shares))

    def undo(self) -> None:
        """Put the allocator back as it was before the trial (once)."""
        a = self.alloc
        for step in reversed(self._undo):
            step()
        for waiter, reason in self._reasons.values():
            waiter.reason = reason
        touched = set(self._nodes)
        for g, instances, held, whole, shares in self._gpus.values():
            g.instances[:] = instances
            for inst, lid in zip(instances, held, strict=True):
                inst.lease = lid
            g.whole_lease = whole
            g.shares.clear()
            g.shares.update(shares)
            touched.add(g.node)
        for node, cpu, memory in self._nodes.values():
            node.cpu_used, node.memory_used = cpu, memory
        for name in sorted(touched):
            if name in a.nodes:  # a node the trial added is gone again
                a._reindex(a.nodes[name])
        self._undo, self._reasons, self._gpus, self._nodes = [], {}, {}, {}


def alone(alloc: Allocator, lease_id: str) -> bool:
    """Whether ending ``lease_id`` (a lease, or a request awaiting approval) changes nothing
    in the pool but itself, so ``Trial.release`` of it would find no grant and no flag:
    nobody waits (a queue pass grants nothing), and no other lease's borrowed flag can change
    (``Allocator.drop`` re-derives its owner's leases, of which it is the only one, and a
    quota group's only where the lease's group has a quota)."""
    if alloc.waiters:
        return False
    lease = alloc.leases.get(lease_id)
    if lease is None:  # awaiting approval: holds nothing
        return True
    if lease.group and lease.group in alloc.quotas.groups:
        return False
    return alloc.leases_of(lease.request.user).keys() == {lease_id}


def _flip(lease: Lease) -> Callable[[], None]:
    """The undo of a borrowed flag's change."""

    def back() -> None:
        lease.borrowed = not lease.borrowed

    return back

"""The pool's GPUs as the readers outside the pool's rules need them: the GPUs a batch of
utilization samples names, with their node (``POST nodes/{name}/samples`` checks the batch) or
their holders (sample ingestion counts busy time for them), and the nodes of one cluster
with their devices and the live leases (the Kubernetes readers of time-slicing and of outside
holds). Each is taken in one locked call: a consistent snapshot, never the allocator's own
objects."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from ...pool.allocator import Allocator
from ...pool.model import RETIRING

__all__ = [
    "ClusterGpuView",
    "ClusterNodeView",
    "ClusterView",
    "GpuHoldersView",
    "GpuNodesView",
    "cluster_view",
    "gpu_holders_view",
    "gpu_nodes_view",
]


@dataclass(frozen=True)
class GpuNodesView:
    """Of the GPUs asked for, those the pool knows, each with its node's name."""

    nodes: Mapping[str, str]


@dataclass(frozen=True)
class GpuHoldersView:
    """Who holds the GPUs asked for (only those held appear): the lease holding a GPU whole
    (``whole``), the leases sharing one (``shares``), a MIG GPU's instances' holders as
    ``(start, lease)`` (``instances``; instances free or retiring left out); and for each of
    these leases how many devices it holds (``lease_devices``, at least 1: its busy time is
    split). Maps rather than an object per GPU: sample ingestion reads it for every batch."""

    whole: Mapping[str, str]
    shares: Mapping[str, tuple[str, ...]]
    instances: Mapping[str, tuple[tuple[int, str], ...]]
    lease_devices: Mapping[str, int]


@dataclass(frozen=True)
class ClusterGpuView:
    """A GPU of a cluster's node: whether MIG is on, its sharing mode, its model's MIG
    profiles (names, catalog order) and the starts of its instances that exist on the device
    (made, or declared on a GPU whose instances are not made on demand)."""

    uuid: str
    mig_enabled: bool
    sharing: str
    profiles: tuple[str, ...]
    made_starts: tuple[int, ...]


@dataclass(frozen=True)
class ClusterNodeView:
    """A node of the cluster and its GPUs (pool order)."""

    name: str
    gpus: tuple[ClusterGpuView, ...]


@dataclass(frozen=True)
class ClusterView:
    """The pool's nodes of one cluster (pool order) and the ids of every live lease."""

    nodes: tuple[ClusterNodeView, ...]
    live: frozenset[str]


def gpu_nodes_view(alloc: Allocator, uuids: Iterable[str]) -> GpuNodesView:
    """The node of each GPU of ``uuids`` that ``alloc`` knows."""
    known = alloc.gpus
    return GpuNodesView({u: known[u].node for u in uuids if u in known})


def gpu_holders_view(alloc: Allocator, uuids: Iterable[str]) -> GpuHoldersView:
    """The holders of the GPUs of ``uuids`` in ``alloc`` (GPUs it does not know: none)."""
    whole: dict[str, str] = {}
    shares: dict[str, tuple[str, ...]] = {}
    instances: dict[str, tuple[tuple[int, str], ...]] = {}
    devices: dict[str, int] = {}
    known, leases = alloc.gpus, alloc.leases
    for uuid in uuids:
        g = known.get(uuid)
        if g is None:
            continue
        held: list[str] = []
        if g.whole_lease:
            whole[uuid] = g.whole_lease
            held.append(g.whole_lease)
        if g.shares:
            held += shares.setdefault(uuid, tuple(g.shares))
        if g.instances:
            mine = tuple((i.start, i.lease) for i in g.instances if i.lease and i.lease != RETIRING)
            if mine:
                instances[uuid] = mine
                held += (le for _, le in mine)
        for lease in held:
            if lease not in devices:
                found = leases.get(lease)
                devices[lease] = max(1, len(found.slots)) if found is not None else 1
    return GpuHoldersView(whole, shares, instances, devices)


def cluster_view(alloc: Allocator, cluster: str) -> ClusterView:
    """The nodes of ``cluster`` in ``alloc``, and its live leases."""
    nodes = tuple(
        ClusterNodeView(
            n.name,
            tuple(
                ClusterGpuView(
                    g.uuid,
                    g.mig_enabled,
                    g.sharing,
                    tuple(g.model.profiles),
                    tuple(i.start for i in g.instances if i.uuid is not None or not g.dynamic_mig),
                )
                for g in n.gpus
            ),
        )
        for n in alloc.nodes.values()
        if n.cluster == cluster
    )
    return ClusterView(nodes, frozenset(alloc.leases))

"""The pool's GPUs as the readers outside the pool's rules need them: the GPUs a batch of
utilization samples names, with their node and holders (``POST nodes/{name}/samples`` checks
the batch, sample ingestion counts busy time for the holders), and the nodes of one cluster
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
    "SampledGpuView",
    "SampledGpusView",
    "cluster_view",
    "sampled_gpus_view",
]


@dataclass(frozen=True)
class SampledGpuView:
    """A GPU a sample names: its ``node``; the lease holding it whole (None: none); the
    leases sharing it; and its MIG instances' holders as ``(start, lease)`` (instances free or
    retiring left out)."""

    node: str
    whole: str | None
    shares: tuple[str, ...]
    instances: tuple[tuple[int, str], ...]


@dataclass(frozen=True)
class SampledGpusView:
    """Of the GPUs asked for, those the pool knows (``gpus`` by uuid), and for every lease
    holding one of them how many devices it holds (at least 1: its busy time is split)."""

    gpus: Mapping[str, SampledGpuView]
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


def sampled_gpus_view(alloc: Allocator, uuids: Iterable[str]) -> SampledGpusView:
    """The GPUs of ``uuids`` that ``alloc`` knows, with their holders."""
    gpus: dict[str, SampledGpuView] = {}
    devices: dict[str, int] = {}
    known, leases = alloc.gpus, alloc.leases
    for uuid in uuids:
        g = known.get(uuid)
        if g is None or uuid in gpus:
            continue
        instances = tuple(
            (i.start, i.lease) for i in g.instances if i.lease and i.lease != RETIRING
        )
        view = gpus[uuid] = SampledGpuView(g.node, g.whole_lease, tuple(g.shares), instances)
        for lease in (view.whole, *view.shares, *(le for _, le in instances)):
            if lease and lease not in devices:
                held = leases.get(lease)
                devices[lease] = max(1, len(held.slots)) if held is not None else 1
    return SampledGpusView(gpus, devices)


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

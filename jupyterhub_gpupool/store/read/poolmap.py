"""The pool's inventory as the pool answers it (``GET pool``: ``PoolView``) and as the admin
panel's map shows it (``GET pool/map``: ``PoolMapView``), built by plain functions from the
allocator held still and, for the map, the live leases' rows.

``pool_view`` builds the inventory whole. The map is built part by part: ``map_gpu_view``,
``map_lease_view`` and ``map_view`` here, the reuse of unchanged parts across builds in
``store.poolmap.MapParts`` (the service's writer reuses the text of each part it has seen,
``service/serialize/poolmap.py``). Views are frozen and pickle.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime

from ...pool.allocator import Allocator
from ...pool.model import RETIRING, Gpu, MigInstance
from ...pool.outside import OUTSIDE
from ...pool.workloads import INTERACTIVE

__all__ = [
    "CapacityView",
    "ClusterView",
    "GpuView",
    "HolderView",
    "InstanceView",
    "MapClusterView",
    "MapGpuView",
    "MapHolderView",
    "MapInstanceView",
    "MapLeaseView",
    "MapNodeView",
    "MapNoticeView",
    "MapRepartitionView",
    "ModelCapacityView",
    "PoolMapView",
    "PoolNodeView",
    "PoolView",
    "PreemptingView",
    "instance_state",
    "map_gpu_view",
    "map_lease_view",
    "pool_view",
]


def instance_state(gpu: Gpu, inst: MigInstance) -> str:
    """``present``, ``planned`` (wanted on a dynamic GPU, not made yet), ``retiring`` or
    ``outside`` (a device a pod the pool did not place holds)."""
    if inst.lease == RETIRING:
        return "retiring"
    if inst.lease == OUTSIDE:
        return "outside"
    return "planned" if gpu.dynamic_mig and inst.uuid is None else "present"


def _holder(lease: str | None) -> str | None:
    """An instance's lease as shown: None for one retiring or held outside the pool."""
    return None if lease in (RETIRING, OUTSIDE) else lease


# -- GET pool ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class CapacityView:
    """GPU units of schedulable hardware: all of it, free and used."""

    total: float
    free: float
    used: float


@dataclass(frozen=True)
class ModelCapacityView:
    """Per GPU model: how many GPUs exist and their free units (0 where nothing new may go)."""

    model: str
    gpus: int
    free_units: float


@dataclass(frozen=True)
class InstanceView:
    """A MIG instance of a GPU: where it lies, its device (``uuid``, None until made), the
    lease holding it and its state (``instance_state``)."""

    profile: str
    start: int
    uuid: str | None
    lease: str | None
    state: str


@dataclass(frozen=True)
class HolderView:
    """A lease's slot on a GPU: whose, and which part (a whole GPU, an instance, a share)."""

    lease: str
    user: str
    kind: str
    profile: str | None
    start: int | None
    milli: int


@dataclass(frozen=True)
class GpuView:
    """A GPU with its flags, free units (0 on a node that takes nothing new), instances and
    holders."""

    uuid: str
    index: int
    model: str
    mig_enabled: bool
    dynamic_mig: bool
    healthy: bool
    cordoned: bool
    outside: bool
    outside_by: tuple[str, ...]
    free_units: float
    instances: tuple[InstanceView, ...]
    holders: tuple[HolderView, ...]


@dataclass(frozen=True)
class PoolNodeView:
    """A node with its flags, CPU and memory (declared and used) and GPUs."""

    name: str
    cordoned: bool
    draining: bool
    unreachable: bool
    cpu_milli: int
    memory_mib: int
    cpu_used: int
    memory_used: int
    gpus: tuple[GpuView, ...]


@dataclass(frozen=True)
class ClusterView:
    """A cluster's nodes, in the allocator's order."""

    name: str
    nodes: tuple[PoolNodeView, ...]


@dataclass(frozen=True)
class PoolView:
    """The inventory: totals, per model, the queue's length; ``clusters`` (every node, GPU
    and holder) only for an admin's view, else None."""

    totals: CapacityView
    models: tuple[ModelCapacityView, ...]
    queue_length: int
    clusters: tuple[ClusterView, ...] | None


def pool_view(alloc: Allocator, *, detail: bool) -> PoolView:
    """What ``alloc`` (held still by the caller) holds; ``detail``: with the clusters."""
    capacity = alloc.capacity()
    totals = CapacityView(capacity["total"], capacity["free"], capacity["used"])
    models = tuple(
        ModelCapacityView(m["model"], m["gpus"], m["free_units"])
        for m in alloc.capacity_by_model().values()
    )
    clusters: tuple[ClusterView, ...] | None = None
    if detail:
        holders: dict[str, list[HolderView]] = {}
        for lease in alloc.leases.values():
            for s in lease.slots:
                holders.setdefault(s.gpu, []).append(
                    HolderView(lease.id, lease.request.user, s.kind, s.profile, s.start, s.milli)
                )
        by_cluster: dict[str, list[PoolNodeView]] = {}
        for node in alloc.nodes.values():
            up = node.schedulable
            gpus = tuple(
                GpuView(
                    uuid=g.uuid,
                    index=g.index,
                    model=g.model.name,
                    mig_enabled=g.mig_enabled,
                    dynamic_mig=g.dynamic_mig,
                    healthy=g.healthy,
                    cordoned=g.cordoned,
                    outside=g.outside,
                    outside_by=tuple(g.outside_by),
                    free_units=g.free_units() if up else 0.0,
                    instances=tuple(
                        InstanceView(
                            i.profile, i.start, i.uuid, _holder(i.lease), instance_state(g, i)
                        )
                        for i in g.instances
                    ),
                    holders=tuple(holders.get(g.uuid, ())),
                )
                for g in node.gpus
            )
            by_cluster.setdefault(node.cluster, []).append(
                PoolNodeView(
                    name=node.name,
                    cordoned=node.cordoned,
                    draining=node.draining,
                    unreachable=node.unreachable,
                    cpu_milli=node.cpu_milli,
                    memory_mib=node.memory_mib,
                    cpu_used=node.cpu_used,
                    memory_used=node.memory_used,
                    gpus=gpus,
                )
            )
        clusters = tuple(ClusterView(c, tuple(n)) for c, n in by_cluster.items())
    return PoolView(totals, models, len(alloc.waiters), clusters)


# -- GET pool/map -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MapInstanceView:
    """A MIG instance on the map: where it lies and how many memory slices it spans."""

    profile: str
    start: int
    slices: int
    lease: str | None
    state: str


@dataclass(frozen=True)
class MapHolderView:
    """A lease holding a GPU without MIG, whole or a share (``milli``)."""

    lease: str
    kind: str
    milli: int


@dataclass(frozen=True)
class MapRepartitionView:
    """The GPU's open re-partition (``waiting`` or ``applying``)."""

    id: int
    state: str


@dataclass(frozen=True)
class MapGpuView:
    """A GPU on the map: its flags, memory slices, free units (0 on a node that takes nothing
    new), instances, holders (a MIG GPU's are its instances' leases: none listed) and open
    re-partition (None: none)."""

    uuid: str
    index: int
    model: str
    mig_enabled: bool
    dynamic_mig: bool
    healthy: bool
    cordoned: bool
    outside: bool
    outside_by: tuple[str, ...]
    memory_slices: int
    free_units: float
    instances: tuple[MapInstanceView, ...]
    holders: tuple[MapHolderView, ...]
    repartition: MapRepartitionView | None


@dataclass(frozen=True)
class MapNodeView:
    """A node on the map: its flags and GPUs."""

    name: str
    cordoned: bool
    draining: bool
    unreachable: bool
    gpus: tuple[MapGpuView, ...]

    @property
    def flags(self) -> tuple[bool, bool, bool]:
        """(cordoned, draining, unreachable)."""
        return self.cordoned, self.draining, self.unreachable


@dataclass(frozen=True)
class MapClusterView:
    """A cluster's nodes on the map, in the allocator's order."""

    name: str
    nodes: tuple[MapNodeView, ...]


@dataclass(frozen=True)
class MapNoticeView:
    """A live lease's reclaim notice on the map: what for, until when, whether a round is
    carrying it out."""

    kind: str
    deadline: datetime | None
    acting: bool


@dataclass(frozen=True)
class PreemptingView:
    """A lease's job's preemption notice (the job is ``preempting``): its runner stops it by
    ``deadline``, killing it then; ``reason`` is the job's (a waiter's, the headroom's refill,
    the lease notice it follows). Not a lease notice: no reclaimer acts on it and nobody can
    extend it, so the map and the lease table show it apart from ``notice``."""

    deadline: datetime | None
    reason: str | None


@dataclass(frozen=True)
class MapLeaseView:
    """A live lease on the map: whose, what holds it (``workload``, its job's name; None: a
    server's), since when it is held (activated, else granted), since when its GPU is idle
    (``idle_since``: epoch seconds as the reclaim counts keep them; None: not idle), its
    reclaim notice and its job's preemption notice (None: none)."""

    id: str
    user: str
    server: str
    workload: str
    job: str | None
    offer: str
    state: str
    units: float
    borrowed: bool
    since: datetime | None
    idle_since: float | None
    notice: MapNoticeView | None
    preempting: PreemptingView | None = None


@dataclass(frozen=True)
class PoolMapView:
    """The admin panel's map at pool ``version``: the totals, per model, the queue's length,
    every cluster, node and GPU, every live lease, and the offers' display names
    (name, display name)."""

    version: int | None
    totals: CapacityView
    models: tuple[ModelCapacityView, ...]
    queue_length: int
    clusters: tuple[MapClusterView, ...]
    leases: tuple[MapLeaseView, ...]
    offers: tuple[tuple[str, str], ...]


def map_gpu_view(
    g: Gpu,
    free_units: float,
    holders: Iterable[tuple[str, str, int]],
    repartition: MapRepartitionView | None,
) -> MapGpuView:
    """``g`` on the map; ``free_units``: its free units as the map counts them (0 on a node
    that takes nothing new); ``holders``: (lease, kind, milli) of each slot on it."""
    instances = []
    for i in g.instances:
        profile = g.model.profiles.get(i.profile)
        instances.append(
            MapInstanceView(
                i.profile,
                i.start,
                1 if profile is None else profile.memory_slices,
                _holder(i.lease),
                instance_state(g, i),
            )
        )
    return MapGpuView(
        uuid=g.uuid,
        index=g.index,
        model=g.model.name,
        mig_enabled=g.mig_enabled,
        dynamic_mig=g.dynamic_mig,
        healthy=g.healthy,
        cordoned=g.cordoned,
        outside=g.outside,
        outside_by=tuple(g.outside_by),
        memory_slices=g.model.memory_slices,
        free_units=free_units,
        instances=tuple(instances),
        holders=tuple(MapHolderView(lid, kind, milli) for lid, kind, milli in holders),
        repartition=repartition,
    )


def map_lease_view(
    *,
    id: str,
    user: str,
    server: str,
    offer: str,
    state: str,
    units: float,
    borrowed: bool,
    since: datetime | None,
    counts: Mapping[str, object] | None,
    notice_kind: str | None,
    deadline: datetime | None,
    acting: bool,
    workload: str | None,
    job: str | None,
    preempting: PreemptingView | None = None,
) -> MapLeaseView:
    """A live lease on the map from its row's columns (``counts``: its reclaim state;
    ``workload`` None: interactive; ``job`` None: a server's lease; ``preempting``: its job's
    preemption notice)."""
    counts = counts or {}
    idle = counts.get("gpu_idle_since") or counts.get("idle_since")
    return MapLeaseView(
        id=id,
        user=user,
        server=server,
        workload=workload or INTERACTIVE,
        job=job,
        offer=offer,
        state=state,
        units=units,
        borrowed=bool(borrowed),
        since=since,
        idle_since=idle if isinstance(idle, (int, float)) else None,
        notice=None if notice_kind is None else MapNoticeView(notice_kind, deadline, acting),
        preempting=preempting,
    )

"""The admin panel's pool map as a view (``read.poolmap.PoolMapView``), rebuilt after a change
from the parts that changed.

A change to the pool (a grant, a release, a notice) touches a GPU or two and a lease or two of
thousands, yet the map is one document. ``MapParts`` keeps the view of every GPU and of every
live lease under a key made of exactly what that view is built from (a GPU's instances,
holders, flags and open re-partition; a lease's columns as read), so a rebuild walks the
allocator and the live leases' rows but builds only what differs from the last build, and
reuses the rest as the very same objects (a node too, when none of its GPUs changed). The
service's writer keeps the text of each node and lease it wrote by that identity
(``service/serialize/poolmap.py``), so it encodes only the parts built afresh. A key holds
everything its view depends on, so a reused view equals the one a fresh build would give.
Only the parts of the latest build are kept, so memory follows the pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ..pool.allocator import Allocator
from ..pool.catalog import GpuModel
from ..pool.model import Gpu
from ..timeparse import parse_time
from .read.poolmap import (
    CapacityView,
    MapClusterView,
    MapGpuView,
    MapLeaseView,
    MapNodeView,
    MapRepartitionView,
    ModelCapacityView,
    PoolMapView,
    PreemptingView,
    map_gpu_view,
    map_lease_view,
)


@dataclass(frozen=True)
class MapInventory:
    """What the allocator held when the map was built: everything but the leases."""

    totals: CapacityView
    models: tuple[ModelCapacityView, ...]
    queue_length: int
    clusters: tuple[MapClusterView, ...]
    offers: tuple[tuple[str, str], ...]


class MapParts:
    """The parts of the last map built, reused where their key has not changed."""

    def __init__(self) -> None:
        # key → (the same key, its view): a build keeps the key object of the last one, so
        # what an unchanged part allocates dies at once (no garbage to collect)
        self._gpus: dict[tuple[Any, ...], tuple[tuple[Any, ...], MapGpuView]] = {}
        self._leases: dict[tuple[Any, ...], tuple[tuple[Any, ...], MapLeaseView]] = {}
        self._nodes: dict[str, MapNodeView] = {}  # by name: kept while nothing of it changes
        self._weights: dict[GpuModel, dict[str, float]] = {}  # per model: a profile's units
        #: Parts built afresh in the last build (GPUs, leases): what a change cost.
        self.built = (0, 0)
        self._gpus_built = 0

    def inventory(
        self, alloc: Allocator, repartitions: Mapping[str, MapRepartitionView]
    ) -> MapInventory:
        """What the allocator (held still by the caller) holds, with the open
        ``repartitions`` by GPU uuid."""
        # a MIG GPU's holders are its instances' leases: only the others' are listed
        plain = {g.uuid for n in alloc.nodes.values() for g in n.gpus if not g.mig_enabled}
        holders: dict[str, list[tuple[str, str, int]]] = {}
        for lease in alloc.leases.values():
            for s in lease.slots:
                if s.gpu in plain:
                    holders.setdefault(s.gpu, []).append((lease.id, s.kind, s.milli))
        old, new = self._gpus, {}
        built = 0
        total = free = 0.0
        models: dict[str, list[Any]] = {}
        clusters: dict[str, list[MapNodeView]] = {}
        nodes: dict[str, MapNodeView] = {}
        for node in alloc.nodes.values():
            gpus = []
            up = node.schedulable
            for g in node.gpus:
                rep = repartitions.get(g.uuid)
                held = holders.get(g.uuid, ())
                key = (
                    g.uuid,
                    up,
                    g.index,
                    g.model,
                    g.mig_enabled,
                    g.dynamic_mig,
                    g.healthy,
                    g.cordoned,
                    g.outside,
                    g.outside_by,
                    g.whole_lease,
                    tuple(g.shares.items()),
                    tuple((i.profile, i.start, i.lease, i.uuid is None) for i in g.instances),
                    tuple(held),
                    rep,
                )
                part = old.get(key)
                if part is None:
                    part = (key, map_gpu_view(g, self._free(g) if up else 0.0, held, rep))
                    built += 1
                new[part[0]] = part
                view = part[1]
                gpus.append(view)
                left = view.free_units
                if g.schedulable and up:
                    total += 1.0
                    free += left
                m = models.get(g.model.name)
                if m is None:
                    m = models[g.model.name] = [0, 0.0]
                m[0] += 1
                m[1] += left
            shown = tuple(gpus)
            flags = (node.cordoned, node.draining, node.unreachable)
            # a node whose flags and GPUs' views are those of the last build is that node's
            # view again (the tuples compare their items by identity first: no field compared)
            view_of = self._nodes.get(node.name)
            if view_of is None or view_of.gpus != shown or view_of.flags != flags:
                view_of = MapNodeView(node.name, *flags, shown)
            nodes[node.name] = view_of
            clusters.setdefault(node.cluster, []).append(view_of)
        self._gpus_built = built
        self._gpus = new
        self._nodes = nodes
        return MapInventory(
            totals=CapacityView(total, free, total - free),
            models=tuple(ModelCapacityView(name, n, f) for name, (n, f) in models.items()),
            queue_length=len(alloc.waiters),
            clusters=tuple(MapClusterView(c, tuple(n)) for c, n in clusters.items()),
            offers=tuple((o.name, o.display_name or o.name) for o in alloc.offers.values()),
        )

    def view(
        self,
        version: int | None,
        inventory: MapInventory,
        rows: Iterable[Sequence[Any]],
        preempting: Mapping[str, PreemptingView] | None = None,
    ) -> PoolMapView:
        """The whole map: ``inventory`` with the live leases' ``rows`` (id, user, server,
        offer, state, units, borrowed, since as text, the reclaim counts as JSON text, the
        notice's kind and deadline as text, whether a round is acting, the lease's workload
        class (None: interactive), its job's name (None: a server's)) and, by lease id, the
        preemption notices of their ``preempting`` jobs."""
        leases = self._lease_views(rows, preempting or {})
        return PoolMapView(
            version=version,
            totals=inventory.totals,
            models=inventory.models,
            queue_length=inventory.queue_length,
            clusters=inventory.clusters,
            leases=leases,
            offers=inventory.offers,
        )

    def _free(self, g: Gpu) -> float:
        """``Gpu.free_units`` in floats (the map's figure; exact fractions are for quotas)."""
        if not g.schedulable:
            return 0.0
        if not g.mig_enabled:
            return g.free_milli / 1000
        units = self._weights.setdefault(g.model, {})
        held = 0.0
        for i in g.instances:
            if i.lease is not None:
                if i.profile not in units:
                    units[i.profile] = float(g.model.profile_units(i.profile))
                held += units[i.profile]
        return max(0.0, 1.0 - held)

    def _lease_views(
        self,
        rows: Iterable[Sequence[Any]],
        preempting: Mapping[str, PreemptingView],
    ) -> tuple[MapLeaseView, ...]:
        """The live leases' views, reused where their row (and job's notice) has not
        changed."""
        old, new = self._leases, {}
        views = []
        built = 0
        for row in rows:
            # few jobs are preempting: the others' key is their row as it came
            key = tuple(row) if row[0] not in preempting else (*row, preempting[row[0]])
            part = old.get(key)
            if part is None:
                part = (key, _lease_view(key))
                built += 1
            new[part[0]] = part
            views.append(part[1])
        self._leases = new
        self.built = (self._gpus_built, built)
        return tuple(views)


def _lease_view(row: tuple[Any, ...]) -> MapLeaseView:
    """A live lease's view from its row as ``MapParts.view`` takes it (and its job's
    preemption notice after it)."""
    lid, user, server, offer, state, units, borrowed, since, counts, kind, dl, acting = row[:12]
    workload, job = row[12:14]
    preempting = row[14] if len(row) > 14 else None
    return map_lease_view(
        id=lid,
        user=user,
        server=server,
        offer=offer,
        state=state,
        units=units,
        borrowed=bool(borrowed),
        since=_dt_text(since),
        counts=json.loads(counts) if counts else None,
        notice_kind=kind,
        deadline=_dt_text(dl),
        acting=bool(acting),
        workload=workload,
        job=job,
        preempting=preempting,
    )


def _dt_text(text: str | None) -> datetime | None:
    """A timestamp read as text (SQLite's own, PostgreSQL's ``timestamp::text``), naive UTC."""
    moment = parse_time(text)
    return None if moment is None else moment.replace(tzinfo=None)

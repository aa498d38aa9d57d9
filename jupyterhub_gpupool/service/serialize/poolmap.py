"""The pool's JSON: the inventory (``GET pool``, ``PoolView``) and the admin panel's map
(``GET pool/map``, ``PoolMapView``) as text.

The map is thousands of GPUs and leases and is asked for every few seconds, so its text is
written by a ``MapWriter`` that keeps what it wrote: the whole document for the last view (the
store answers the very same view until the pool version moves), and the text of every node and
lease of it, by the part's identity (the store reuses the view of a part that did not change,
``store.poolmap.MapParts``), so after a change only the nodes and leases built afresh are
encoded. The
text is byte for byte what ``json.dumps`` of the whole would write (compact separators).
"""

from __future__ import annotations

import json
import threading
from typing import Any, cast

from ...store.read.poolmap import (
    CapacityView,
    GpuView,
    MapGpuView,
    MapLeaseView,
    MapNodeView,
    ModelCapacityView,
    PoolMapView,
    PoolView,
    PreemptingView,
)
from ...store.rows import epoch
from ...timeparse import format_time

__all__ = [
    "MapWriter",
    "gpu_fields_json",
    "gpu_json",
    "map_gpu_json",
    "map_lease_json",
    "pool_json",
    "pool_map_text",
    "preempting_json",
]


def _totals_json(totals: CapacityView) -> dict[str, Any]:
    return {"total": totals.total, "free": totals.free, "used": totals.used}


def _models_json(models: tuple[ModelCapacityView, ...]) -> list[dict[str, Any]]:
    return [{"model": m.model, "gpus": m.gpus, "free_units": m.free_units} for m in models]


def gpu_fields_json(g: GpuView | MapGpuView, **between: Any) -> dict[str, Any]:
    """What a GPU's JSON says in ``GET pool`` and on the map alike, in this order: its name,
    model and flags, then the view's own fields ``between`` (the map's ``memory_slices``),
    then its free units. Each serializer adds its instances and holders after."""
    return {
        "uuid": g.uuid,
        "index": g.index,
        "model": g.model,
        "mig_enabled": g.mig_enabled,
        "dynamic_mig": g.dynamic_mig,
        "healthy": g.healthy,
        "cordoned": g.cordoned,
        "outside": g.outside,
        "outside_by": list(g.outside_by),
        **between,
        "free_units": g.free_units,
    }


def gpu_json(g: GpuView) -> dict[str, Any]:
    """A GPU of ``GET pool``'s clusters: its flags, free units, instances and holders."""
    return {
        **gpu_fields_json(g),
        "instances": [
            {
                "profile": i.profile,
                "start": i.start,
                "uuid": i.uuid,
                "lease": i.lease,
                "state": i.state,
            }
            for i in g.instances
        ],
        "holders": [
            {
                "lease": h.lease,
                "user": h.user,
                "kind": h.kind,
                "profile": h.profile,
                "start": h.start,
                "milli": h.milli,
            }
            for h in g.holders
        ],
    }


def pool_json(view: PoolView) -> dict[str, Any]:
    """``GET pool``: totals, per model and the queue's length; an admin's view adds every
    cluster, node, GPU and holder."""
    out: dict[str, Any] = {
        "totals": _totals_json(view.totals),
        "models": _models_json(view.models),
        "queue_length": view.queue_length,
    }
    if view.clusters is not None:
        out["clusters"] = [
            {
                "name": c.name,
                "nodes": [
                    {
                        "name": n.name,
                        "cordoned": n.cordoned,
                        "draining": n.draining,
                        "unreachable": n.unreachable,
                        "cpu_milli": n.cpu_milli,
                        "memory_mib": n.memory_mib,
                        "cpu_used": n.cpu_used,
                        "memory_used": n.memory_used,
                        "gpus": [gpu_json(g) for g in n.gpus],
                    }
                    for n in c.nodes
                ],
            }
            for c in view.clusters
        ]
    return out


# -- the map ----------------------------------------------------------------------------------


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


def map_gpu_json(g: MapGpuView) -> dict[str, Any]:
    """A GPU on the map."""
    rep = g.repartition
    return {
        **gpu_fields_json(g, memory_slices=g.memory_slices),
        "instances": [
            {
                "profile": i.profile,
                "start": i.start,
                "slices": i.slices,
                "lease": i.lease,
                "state": i.state,
            }
            for i in g.instances
        ],
        "holders": [{"lease": h.lease, "kind": h.kind, "milli": h.milli} for h in g.holders],
        "repartition": None if rep is None else {"id": rep.id, "state": rep.state},
    }


def preempting_json(p: PreemptingView | None) -> dict[str, Any] | None:
    """A job's preemption notice: when its grace ends (its runner kills it then) and why."""
    return None if p is None else {"deadline": format_time(p.deadline), "reason": p.reason}


def map_lease_json(lease: MapLeaseView) -> dict[str, Any]:
    """A live lease on the map (the member's value; its id is the member's name). Times are
    epoch seconds, but for the notices' deadlines: the reader subtracts them from now.
    ``preempting``: its job's preemption notice, which is no lease notice (``notice``)."""
    notice = lease.notice
    return {
        "user": lease.user,
        "server": lease.server,
        "class": lease.workload,
        "job": lease.job,
        "offer": lease.offer,
        "state": lease.state,
        "units": lease.units,
        "borrowed": lease.borrowed,
        "since": None if lease.since is None else epoch(lease.since),
        "idle_since": lease.idle_since,
        "notice": None
        if notice is None
        else {
            "kind": notice.kind,
            "deadline": format_time(notice.deadline),
            "acting": notice.acting,
        },
        "preempting": preempting_json(lease.preempting),
    }


class MapWriter:
    """Writes maps as text, keeping the text of the last one and of its nodes and leases.

    The text of a part is kept under the part's ``id``. That is sound because the last view
    is kept until the next is written: every part with a kept text is alive, so no other
    object can have its id, and a part of the next view with a kept id is that very part.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: tuple[PoolMapView, str] | None = None
        self._nodes: dict[int, str] = {}  # id(node view) → its text, for the last view's
        self._leases: dict[int, str] = {}  # id(lease view) → its member's text, likewise
        #: Parts encoded afresh by the last write (nodes, leases): what a change cost.
        self.encoded = (0, 0)

    def text(self, view: PoolMapView) -> str:
        """``view`` as the ``GET pool/map`` document (less ``util`` and ``now``)."""
        with self._lock:
            last = self._last
            if last is not None and last[0] is view:
                return last[1]
            text, nodes, leases = self._write(view)
            # all at once: the view kept is the one whose parts' ids are the texts' keys
            self._last, self._nodes, self._leases = (view, text), nodes, leases
            return text

    def _write(self, view: PoolMapView) -> tuple[str, dict[int, str], dict[int, str]]:
        """The text of ``view``, and the texts of its nodes and leases by id."""
        old_nodes, nodes = self._nodes, {}
        encoded_nodes = 0
        clusters = []
        for c in view.clusters:
            parts = []
            for n in c.nodes:
                key = id(n)
                node = old_nodes.get(key)
                if node is None:
                    node = _node_text(n)
                    encoded_nodes += 1
                nodes[key] = node
                parts.append(node)
            clusters.append(f'{{"name":{_dumps(c.name)},"nodes":[{",".join(parts)}]}}')
        leases = view.leases
        ids = list(map(id, leases))
        found = list(map(self._leases.get, ids))
        encoded_leases = found.count(None)
        if encoded_leases:  # new or changed leases: a refresh after a change has few
            members = [
                _lease_member(le) if member is None else member
                for member, le in zip(found, leases, strict=True)
            ]
        else:
            members = cast(list[str], found)
        self.encoded = (encoded_nodes, encoded_leases)
        offers = {name: display for name, display in view.offers}
        text = (
            f'{{"version":{_dumps(view.version)},'
            f'"totals":{_dumps(_totals_json(view.totals))},'
            f'"models":{_dumps(_models_json(view.models))},'
            f'"queue_length":{_dumps(view.queue_length)},'
            f'"clusters":[{",".join(clusters)}],'
            f'"leases":{{{",".join(members)}}},'
            f'"offers":{_dumps(offers)}}}'
        )
        return text, nodes, dict(zip(ids, members, strict=True))


def _lease_member(le: MapLeaseView) -> str:
    """A member of the map's ``leases``: the lease's id and its JSON."""
    return f"{_dumps(le.id)}:{_dumps(map_lease_json(le))}"


def _node_text(n: MapNodeView) -> str:
    """A node on the map with its GPUs."""
    gpus = ",".join(_dumps(map_gpu_json(g)) for g in n.gpus)
    return (
        f'{{"name":{_dumps(n.name)},"cordoned":{_dumps(n.cordoned)},'
        f'"draining":{_dumps(n.draining)},"unreachable":{_dumps(n.unreachable)},'
        f'"gpus":[{gpus}]}}'
    )


#: The service's writer of the map (one per process: it keeps the last map's text).
MAP_WRITER = MapWriter()


def pool_map_text(view: PoolMapView) -> str:
    """``view`` as ``GET pool/map``'s document (less ``util`` and ``now``), by ``MAP_WRITER``."""
    return MAP_WRITER.text(view)

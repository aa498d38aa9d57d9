"""The admin panel's pool map as JSON text, rebuilt after a change from the parts that changed.

A change to the pool (a grant, a release, a notice) touches a GPU or two and a lease or two of
thousands, yet the map is one document. ``MapText`` keeps the encoded text of every GPU and of
every live lease under a key made of exactly what that text is built from (a GPU's instances,
holders, flags and open re-partition; a lease's columns as read), so a rebuild walks the
allocator and the live leases' rows but encodes only what differs from the last build, and
joins the rest as it was. A key holds everything its text depends on, so a reused text is the
one a fresh encoding would give: the document is byte for byte what ``json.dumps`` of the
whole would write. Only the entries of the latest build are kept, so memory follows the pool.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from ..pool.allocator import Allocator
from ..pool.catalog import GpuModel
from ..pool.model import RETIRING, Gpu
from ..pool.outside import OUTSIDE
from ..pool.workloads import INTERACTIVE
from ..timeparse import parse_time
from .rows import epoch, ts
from .views import instance_state


def _dumps(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


class MapText:
    """The encoded parts of the last map built, reused where their key has not changed."""

    def __init__(self) -> None:
        # key → (the same key, its text[, free units]): a build keeps the key object of the
        # last one, so what an unchanged part allocates dies at once (no garbage to collect)
        self._gpus: dict[tuple[Any, ...], tuple[tuple[Any, ...], str, float]] = {}
        self._leases: dict[tuple[Any, ...], tuple[tuple[Any, ...], str]] = {}
        self._nodes: dict[tuple[Any, ...], str] = {}  # a node's fields → the text before its GPUs
        self._weights: dict[GpuModel, dict[str, float]] = {}  # per model: a profile's units
        #: Parts encoded afresh in the last build (GPUs, leases): what a change cost.
        self.encoded = (0, 0)
        self._gpus_encoded = 0

    def inventory(
        self, alloc: Allocator, repartitions: Mapping[str, dict[str, Any]]
    ) -> tuple[str, str]:
        """What the allocator (held still by the caller) holds, with the open
        ``repartitions`` by GPU uuid, as text: the members before ``leases`` and ``offers``."""
        # a MIG GPU's holders are its instances' leases: only the others' are listed
        plain = {g.uuid for n in alloc.nodes.values() for g in n.gpus if not g.mig_enabled}
        holders: dict[str, list[tuple[str, str, int]]] = {}
        for lease in alloc.leases.values():
            for s in lease.slots:
                if s.gpu in plain:
                    holders.setdefault(s.gpu, []).append((lease.id, s.kind, s.milli))
        old, new = self._gpus, {}
        encoded = 0
        total = free = 0.0
        models: dict[str, dict[str, Any]] = {}
        clusters: dict[str, list[str]] = {}
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
                    None if rep is None else (rep["id"], rep["state"]),
                )
                part = old.get(key)
                if part is None:
                    part = (key, *self._gpu(g, up, held, rep))
                    encoded += 1
                new[part[0]] = part
                _, text, left = part
                gpus.append(text)
                if g.schedulable and up:
                    total += 1.0
                    free += left
                m = models.get(g.model.name)
                if m is None:
                    m = models[g.model.name] = {"model": g.model.name, "gpus": 0, "free_units": 0.0}
                m["gpus"] += 1
                m["free_units"] += left
            fields = (node.name, node.cordoned, node.draining, node.unreachable)
            head = self._nodes.get(fields)
            if head is None:
                head = self._nodes[fields] = (
                    f'{{"name":{_dumps(node.name)},"cordoned":{_dumps(node.cordoned)},'
                    f'"draining":{_dumps(node.draining)},"unreachable":{_dumps(node.unreachable)},'
                )
            clusters.setdefault(node.cluster, []).append(f'{head}"gpus":[{",".join(gpus)}]}}')
        if len(self._nodes) > 4 * len(alloc.nodes):  # nodes gone or changed: start afresh
            self._nodes = {}
        self._gpus_encoded = encoded
        self._gpus = new
        offers = {o.name: o.display_name or o.name for o in alloc.offers.values()}
        cluster_text = ",".join(
            f'{{"name":{_dumps(c)},"nodes":[{",".join(n)}]}}' for c, n in clusters.items()
        )
        head = (
            f'"totals":{_dumps({"total": total, "free": free, "used": total - free})},'
            f'"models":{_dumps(list(models.values()))},'
            f'"queue_length":{_dumps(len(alloc.waiters))},'
            f'"clusters":[{cluster_text}]'
        )
        return head, _dumps(offers)

    def document(
        self, version: int | None, inventory: tuple[str, str], rows: Iterable[Sequence[Any]]
    ) -> str:
        """The whole map: ``inventory``'s text with the live leases' ``rows``
        (id, user, server, offer, state, units, borrowed, since as text, the reclaim counts as
        JSON text, the notice's kind and deadline as text, whether a round is acting, the
        lease's workload class (None: interactive), its job's name (None: a server's))."""
        leases, encoded = self._lease_texts(rows)
        self.encoded = (self._gpus_encoded, encoded)
        head, offers = inventory  # the members in the order the map has always had
        return f'{{"version":{_dumps(version)},{head},"leases":{{{leases}}},"offers":{offers}}}'

    def _gpu(
        self, g: Gpu, up: bool, holders: Iterable[tuple[str, str, int]], rep: Any
    ) -> tuple[str, float]:
        """A GPU's text and its free units (0 on an unschedulable node)."""
        left = self._free(g) if up else 0.0
        instances = []
        for i in g.instances:
            try:
                size = g.model.profiles[i.profile].memory_slices
            except KeyError:
                size = 1
            instances.append(
                {
                    "profile": i.profile,
                    "start": i.start,
                    "slices": size,
                    "lease": None if i.lease in (RETIRING, OUTSIDE) else i.lease,
                    "state": instance_state(g, i),
                }
            )
        doc = {
            "uuid": g.uuid,
            "index": g.index,
            "model": g.model.name,
            "mig_enabled": g.mig_enabled,
            "dynamic_mig": g.dynamic_mig,
            "healthy": g.healthy,
            "cordoned": g.cordoned,
            "outside": g.outside,
            "outside_by": list(g.outside_by),
            "memory_slices": g.model.memory_slices,
            "free_units": left,
            "instances": instances,
            "holders": [
                {"lease": lid, "kind": kind, "milli": milli} for lid, kind, milli in holders
            ],
            "repartition": rep,
        }
        return _dumps(doc), left

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

    def _lease_texts(self, rows: Iterable[Sequence[Any]]) -> tuple[str, int]:
        """The members of the ``leases`` object, and how many were encoded afresh."""
        old, new = self._leases, {}
        parts = []
        encoded = 0
        for row in rows:
            key = tuple(row)
            part = old.get(key)
            if part is None:
                part = (key, _lease_text(key))
                encoded += 1
            new[part[0]] = part
            parts.append(part[1])
        self._leases = new
        return ",".join(parts), encoded


def _lease_text(row: tuple[Any, ...]) -> str:
    """One member of ``leases`` (the row as ``MapText.document`` takes it)."""
    lid, user, server, offer, state, units, borrowed, since, counts, kind, dl, acting = row[:12]
    workload, job = row[12:]
    counts = json.loads(counts) if counts else {}
    doc = {
        "user": user,
        "server": server,
        "class": workload or INTERACTIVE,
        "job": job,
        "offer": offer,
        "state": state,
        "units": units,
        "borrowed": bool(borrowed),
        "since": _epoch_text(since),
        "idle_since": counts.get("gpu_idle_since") or counts.get("idle_since"),
        "notice": None
        if kind is None
        else {"kind": kind, "deadline": ts(_dt_text(dl)), "acting": bool(acting)},
    }
    return f"{_dumps(lid)}:{_dumps(doc)}"


def _dt_text(text: str | None) -> datetime | None:
    """A timestamp read as text (SQLite's own, PostgreSQL's ``timestamp::text``), naive UTC."""
    moment = parse_time(text)
    return None if moment is None else moment.replace(tzinfo=None)


def _epoch_text(text: str | None) -> float | None:
    dt = _dt_text(text)
    return None if dt is None else epoch(dt)

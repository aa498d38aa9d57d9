"""What ResourceClaims the pool did not create hold, device by device (DRA; pure: dicts in,
values out).

With Dynamic Resource Allocation a claim's ``status.allocation.devices.results`` name the very
devices it holds (driver, pool, device), and the ResourceSlices the driver publishes say what
each device is: its node, and for NVIDIA's driver (``gpu.nvidia.com``) a whole GPU's ``uuid`` or
a MIG device's ``parentUUID``, ``profile`` and memory slices (static MIG: ``memorySlice<i>``
capacities; dynamic MIG: ``memory-slice-<i>`` counters it consumes), so the pool learns exactly
which GPU or placement is taken (``pool.outside.mark_exact``). The pool's own claims are not
outside: a server's claim carries the lease label of a live lease, a GPU's shared claim the
shared-GPU label (``spawner.dra``; the names are repeated here, as the service does not import
the spawner). A device the pool knows on a node whose driver publishes no such device is held
outside too: no claim can get it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ..pool.outside import Held

DRIVER = "gpu.nvidia.com"
#: Labels of the claims the pool makes (``spawner.objects.LEASE_KEY``, ``spawner.dra``).
LEASE_LABEL = "gpupool.jupyter.org/lease"
SHARED_GPU_LABEL = "gpupool.jupyter.org/shared-gpu"
UNPUBLISHED = "(not published by the DRA driver)"


@dataclass(frozen=True)
class Device:
    """One device the driver publishes, in the pool's terms: its node, GPU uuid (the parent's
    for MIG) and, for a MIG device, the placement's start (its first memory slice)."""

    node: str
    gpu: str
    start: int | None = None


def _value(attribute: Mapping[str, Any] | None) -> Any:
    for key in ("string", "int", "bool", "version"):
        if attribute and key in attribute:
            return attribute[key]
    return None


def _slices_of(device: Mapping[str, Any]) -> list[int]:
    capacity = device.get("capacity") or {}
    counters = {
        name for use in device.get("consumesCounters") or () for name in (use.get("counters") or {})
    }
    for names, prefix in ((capacity, "memorySlice"), (counters, "memory-slice-")):
        found = [int(n[len(prefix) :]) for n in names if n[len(prefix) :].isdigit()]
        if found:
            return sorted(found)
    return []


def published(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], Device]:
    """The driver's GPUs and MIG devices by ``(pool, device name)`` (others are left out)."""
    out: dict[tuple[str, str], Device] = {}
    for s in slices:
        spec = s.get("spec") or {}
        node = spec.get("nodeName")
        if spec.get("driver") != DRIVER or not node:
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or ():
            attrs = {k: _value(v) for k, v in (device.get("attributes") or {}).items()}
            if attrs.get("type") == "gpu" and attrs.get("uuid"):
                out[(pool, device["name"])] = Device(node, str(attrs["uuid"]))
            elif attrs.get("type") == "mig" and attrs.get("parentUUID"):
                occupied = _slices_of(device)
                if occupied:
                    out[(pool, device["name"])] = Device(
                        node, str(attrs["parentUUID"]), occupied[0]
                    )
    return out


def pool_owns(claim: Mapping[str, Any], live_labels: Iterable[str]) -> bool:
    """A claim the pool made: a live lease's server claim, or a GPU's shared claim."""
    labels = (claim.get("metadata") or {}).get("labels") or {}
    return SHARED_GPU_LABEL in labels or labels.get(LEASE_LABEL) in set(live_labels)


def holder(claim: Mapping[str, Any]) -> str:
    """``namespace/name`` of a claim, with the pods it is reserved for."""
    meta = claim.get("metadata") or {}
    pods = [
        r.get("name", "")
        for r in (claim.get("status") or {}).get("reservedFor") or ()
        if r.get("resource") == "pods"
    ]
    who = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
    return f"{who} (pod {', '.join(pods)})" if pods else who


@dataclass(frozen=True)
class PoolGpu:
    """What the pool knows of one GPU on a node: whether it runs MIG, and the placements of
    its instances that should be published (made ones; a dynamic GPU's plan is the pool's)."""

    uuid: str
    mig: bool
    starts: tuple[int, ...] = ()


def outside_devices(
    slices: Iterable[Mapping[str, Any]],
    claims: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, Iterable[PoolGpu]],
    live_labels: Iterable[str],
) -> dict[str, list[Held]]:
    """Per pool node (``nodes``: name → its GPUs), the devices held outside the pool: those
    the allocations of claims the pool did not make name, and those the node's driver does not
    publish."""
    devices = published(slices)
    live = set(live_labels)
    out: dict[str, list[Held]] = {n: [] for n in nodes}
    for claim in claims:
        if pool_owns(claim, live):
            continue
        allocation = (claim.get("status") or {}).get("allocation") or {}
        for r in (allocation.get("devices") or {}).get("results") or ():
            if r.get("driver") != DRIVER:
                continue
            device = devices.get((r.get("pool", ""), r.get("device", "")))
            if device is not None and device.node in out:
                out[device.node].append((device.gpu, device.start, holder(claim)))
    there = {(d.node, d.gpu, d.start) for d in devices.values()}
    for name, gpus in nodes.items():
        for g in gpus:
            if not g.mig and (name, g.uuid, None) not in there:
                out[name].append((g.uuid, None, UNPUBLISHED))
            for start in g.starts if g.mig else ():
                if (name, g.uuid, start) not in there:
                    out[name].append((g.uuid, start, UNPUBLISHED))
    return {
        n: sorted(set(held), key=lambda h: (h[0], h[1] is not None, h[1] or 0, h[2]))
        for n, held in out.items()
    }

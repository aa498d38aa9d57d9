"""What pods hold on each node, as the API server says (pure: dicts in, values out).

The device plugin's resources are extended resources: a container's ``limits`` (``requests``,
if given, must equal them) say how many devices it gets, and a pod holds the larger of its
containers' sum and its largest init container (Kubernetes' effective request). A pod holds
them from the moment it is bound to a node (``spec.nodeName``) until it ends (phase
``Succeeded`` or ``Failed``, or deleted). Pods carrying the pool's lease annotation for a live
lease are the pool's own; every other holder is *outside* the pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..pool.outside import WHOLE
from .nodes import GPU_RESOURCE, MIG_RESOURCE, resource_profile

#: The annotation the spawner puts on a server's pod (``spawner.objects.LEASE_KEY``).
LEASE_ANNOTATION = "gpupool.jupyter.org/lease"
#: Phases of a pod that holds nothing any more.
ENDED = ("Succeeded", "Failed")


def _quantity(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def _container_gpus(container: Mapping[str, Any]) -> dict[str, int]:
    res = container.get("resources") or {}
    got = {**(res.get("requests") or {}), **(res.get("limits") or {})}
    return {k: _quantity(v) for k, v in got.items() if k.startswith("nvidia.com/")}


def pod_gpus(pod: Mapping[str, Any]) -> dict[str, int]:
    """The ``nvidia.com/*`` devices a pod holds, by resource name (effective request)."""
    spec = pod.get("spec") or {}
    total: dict[str, int] = {}
    for c in spec.get("containers") or ():
        for k, n in _container_gpus(c).items():
            total[k] = total.get(k, 0) + n
    for c in spec.get("initContainers") or ():
        for k, n in _container_gpus(c).items():
            total[k] = max(total.get(k, 0), n)
    return {k: n for k, n in total.items() if n > 0}


def holding(pod: Mapping[str, Any]) -> bool:
    """Bound to a node and not ended: its devices are taken."""
    meta = pod.get("metadata") or {}
    phase = (pod.get("status") or {}).get("phase")
    return (
        bool((pod.get("spec") or {}).get("nodeName"))
        and phase not in ENDED
        and not (meta.get("deletionTimestamp") and phase is None)
    )


def lease_of(pod: Mapping[str, Any]) -> str | None:
    """The pool lease a pod serves (its annotation), if any."""
    return ((pod.get("metadata") or {}).get("annotations") or {}).get(LEASE_ANNOTATION)


def count_key(resource: str, profiles: Iterable[str]) -> str | None:
    """``pool.outside``'s key of a device-plugin resource: ``gpu`` for ``nvidia.com/gpu``, the
    MIG profile for ``nvidia.com/mig-<profile>`` (``1g.10gb.me`` is ``1g.10gb+me``); None for
    anything else (shared replicas, other vendors)."""
    if resource == GPU_RESOURCE:
        return WHOLE
    if resource.startswith(MIG_RESOURCE):
        name = resource[len(MIG_RESOURCE) :]
        return next((p for p in profiles if resource_profile(p) == name), name)
    return None


def outside_of(
    pods: Iterable[Mapping[str, Any]],
    nodes: Mapping[str, Iterable[str]],
    live: Iterable[str],
) -> dict[str, tuple[dict[str, int], list[str]]]:
    """Per pool node (``nodes``: name → the MIG profiles its GPUs know), what pods not of a
    ``live`` lease hold: (counts by ``pool.outside`` key, ``namespace/name`` of each holder)."""
    live = set(live)
    out: dict[str, tuple[dict[str, int], list[str]]] = {n: ({}, []) for n in nodes}
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in out or not holding(pod) or lease_of(pod) in live:
            continue
        counts, names = out[node]
        held = False
        for resource, n in pod_gpus(pod).items():
            key = count_key(resource, nodes[node])
            if key is not None:
                counts[key] = counts.get(key, 0) + n
                held = True
        if held:
            meta = pod.get("metadata") or {}
            names.append(f"{meta.get('namespace', '')}/{meta.get('name', '')}")
    return out


def unadvertised(node: Mapping[str, Any], whole_gpus: int) -> int:
    """Whole GPUs the pool knows on a node that its device plugin does not advertise
    (``status.allocatable``: an unhealthy device, a plugin not running): no pod can get them."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return max(0, whole_gpus - _quantity(allocatable.get(GPU_RESOURCE, 0)))

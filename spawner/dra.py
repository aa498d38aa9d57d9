"""Dynamic Resource Allocation objects for a pool lease: the device the pool chose, by name.

With the device plugin a pod asks for *a* ``nvidia.com/gpu`` on a node and the plugin picks
which; with Kubernetes' Dynamic Resource Allocation (``resource.k8s.io/v1``, GA in 1.34) and
NVIDIA's DRA driver a pod references a ResourceClaim whose CEL selector names the device, so the
GPU the pool chose is the GPU the pod gets. Everything here is pure (dicts and the client's pod
model in, dicts out), so it is tested against literal objects and the Kubernetes schemas
(tests/unit/test_kube_dra.py); the calls live in ``spawner/kube.py``.

Facts from NVIDIA's DRA driver (github.com/NVIDIA/k8s-dra-driver-gpu, now
kubernetes-sigs/dra-driver-nvidia-gpu, HEAD 2240711 of 2026-05-15), copied here:

- DeviceClasses ``gpu.nvidia.com`` (``device.attributes['gpu.nvidia.com'].type == 'gpu'``) and
  ``mig.nvidia.com`` (``type == 'mig'``) (``deployments/helm/.../deviceclass-{gpu,mig}.yaml``);
- a whole GPU's attributes include ``uuid`` (``cmd/gpu-kubelet-plugin/deviceinfo.go``), its
  capacity ``memory`` in bytes (``partitions.go``); a MIG device has ``uuid``, ``parentUUID`` and
  ``profile`` (``mig.go``, ``CommonAttributesMig``), and one capacity ``memorySlice<i>`` for each
  memory slice it occupies (``deviceinfo.go``), so ``parentUUID`` + ``profile`` + the slice at
  the pool's placement ``start`` name exactly one instance;
- with the driver's ``DynamicMIG`` feature gate a MIG-mode GPU is *partitionable*
  (``partitions.go``, Kubernetes KEP-4815): one counter set per GPU (``gpu-<minor>-counter-set``:
  capacity counters and one ``memory-slice-<i>`` counter per memory slice) and, for every
  profile and placement, an abstract MIG device ``gpu-<minor>-mig-<profile>-<id>-<start>`` with
  ``parentUUID`` and ``profile`` but no ``uuid`` and no ``memorySlice<i>`` capacity, whose
  ``consumesCounters`` name its memory slices; the scheduler allocates one whose counters are
  free and the driver makes the instance when the claim is prepared. CEL sees no counters, so
  such a claim selects parent and profile, and the placement is the scheduler's;
- sharing is per claim: ``GpuConfig`` (``resource.nvidia.com/v1beta1``) ``sharing.strategy``
  ``TimeSlicing`` or ``MPS`` with ``mpsConfig.defaultPinnedDeviceMemoryLimit``, a per-client
  memory limit (``api/nvidia.com/resource/v1beta1/sharing.go``, demo ``gpu-test-mps.yaml``).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Mapping
from decimal import Decimal
from typing import Any

from jupyterhub_gpupool.kube.draselect import API_VERSION as API_VERSION
from jupyterhub_gpupool.kube.draselect import DRIVER as DRIVER
from jupyterhub_gpupool.kube.draselect import GPU_CLASS as GPU_CLASS
from jupyterhub_gpupool.kube.draselect import MIG_CLASS as MIG_CLASS
from jupyterhub_gpupool.kube.draselect import device_selector as device_selector
from jupyterhub_gpupool.kube.draselect import exact_device

from .objects import LEASE_KEY, OFFER_KEY, PREFIX, label_value
from .objects import check_lease as check_lease  # DRAClaims calls it as dra.check_lease

#: ``device_backend`` values: ``auto`` picks ``dra`` where the API and the driver are there.
BACKENDS = ("auto", "dra", "device-plugin")
#: How the pods of a GPU's shared claim share it (the driver's ``GpuSharing.strategy``).
SHARE_STRATEGIES = ("MPS", "TimeSlicing")
CONFIG_API_VERSION = "resource.nvidia.com/v1beta1"

#: ``firstAvailable`` subrequests: the granted device, then the fallbacks (Kubernetes allows 8).
GRANTED_SUB = "granted"
FALLBACK_SUB = "fallback"
MAX_SUBREQUESTS = 8
#: The pod's names for its claims (``spec.resourceClaims[].name``).
SERVER_REF = "gpu"
SHARED_REF = "gpu-shared"
#: Labels and annotations on the claims the pool makes.
SHARED_GPU_KEY = PREFIX + "shared-gpu"
CLIENT_MEMORY_KEY = PREFIX + "mps-client-memory"
MANAGED_BY = {"app.kubernetes.io/managed-by": "jupyterhub-gpupool"}

_DNS_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?\Z")
_QUANTITY = re.compile(r"([0-9]+(?:\.[0-9]+)?)([a-zA-Z]*)\Z")
_SUFFIX = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
}


def _name(prefix: str, value: str, limit: int = 63) -> str:
    """``prefix + value`` as a DNS label; cleaned, cut and hashed where ``value`` is not one."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    name = f"{prefix}{cleaned}"
    if len(name) <= limit and _DNS_NAME.match(name) and cleaned == value.lower():
        return name
    digest = hashlib.sha256(value.encode()).hexdigest()[:10]
    return f"{prefix}{cleaned[: limit - len(prefix) - 11].rstrip('-')}-{digest}".replace("--", "-")


def claim_name(pod_name: str) -> str:
    """The server claim of the pod ``pod_name`` (one per server, made and deleted with it)."""
    return _name("", f"{pod_name}-gpu", 253)


def shared_claim_name(gpu_uuid: str) -> str:
    """The pool-managed shared claim of one GPU (every share of it references this one)."""
    return _name("gpupool-share-", gpu_uuid)


def _metadata(name: str, namespace: str, labels: Mapping[str, str]) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": {**MANAGED_BY, **labels}}


def fallback_slots(lease: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The devices the pool says the lease may fall back to (its ``fallback``: free devices of
    the same offer on the same node when the lease was read), checked to be of the lease's
    kind; empty where the offer does not allow it."""
    kind = lease["slots"][0]["kind"] if lease.get("slots") else None
    out = []
    for alt in lease.get("fallback") or ():
        if not isinstance(alt, Mapping) or alt.get("kind") != kind or kind not in ("gpu", "mig"):
            raise ValueError(f"fallback device {alt!r} is not a {kind} device")
        out.append(dict(alt))
    return out[: MAX_SUBREQUESTS - 1]


def server_claim(
    lease: Mapping[str, Any],
    *,
    name: str,
    namespace: str,
    partitioned: Collection[str] = (),
) -> dict[str, Any] | None:
    """The ResourceClaim of a lease's whole GPUs or MIG slices: one request per slot, each
    selecting exactly its device (None for shares: they use their GPU's shared claim). A MIG
    slice on a GPU of ``partitioned`` (dynamic MIG, :func:`partitioned_gpus`) selects its parent
    and profile: the claim makes the instance where the scheduler finds free memory slices.

    A lease with ``fallback`` devices (an offer with ``fallback: true``) asks with
    ``firstAvailable``: the granted device first (subrequest ``granted``), then each
    alternative (``fallback-<n>``), so a pod whose device was taken first gets another;
    the result's request is then ``<request>/<subrequest>``."""
    kind = check_lease(lease)
    if kind == "shared":
        return None
    alternatives = fallback_slots(lease)
    requests: list[dict[str, Any]] = []
    for i, slot in enumerate(lease["slots"]):
        own = exact_device(slot, slot["gpu"] not in partitioned)
        if not alternatives:
            requests.append({"name": f"{SERVER_REF}-{i}", "exactly": own})
            continue
        subs = [{"name": GRANTED_SUB, **own}] + [
            {"name": f"{FALLBACK_SUB}-{n}", **exact_device(alt, alt["gpu"] not in partitioned)}
            for n, alt in enumerate(alternatives)
        ]
        requests.append({"name": f"{SERVER_REF}-{i}", "firstAvailable": subs})
    labels = {LEASE_KEY: label_value(lease["id"]), OFFER_KEY: label_value(lease["offer"])}
    return {
        "apiVersion": API_VERSION,
        "kind": "ResourceClaim",
        "metadata": _metadata(name, namespace, labels),
        "spec": {"devices": {"requests": requests}},
    }


def client_memory_mib(gpu_memory_bytes: int, milli: int) -> int:
    """An MPS client's pinned memory limit for a share of ``milli`` thousandths of a GPU with
    ``gpu_memory_bytes`` of memory, in MiB, rounded down (the driver wants at least 1 MiB)."""
    mib = gpu_memory_bytes * milli // 1000 // 2**20
    if mib < 1:
        raise ValueError(f"a share of {milli}/1000 of {gpu_memory_bytes} bytes is under 1 MiB")
    return mib


def shared_claim(
    gpu_uuid: str,
    *,
    namespace: str,
    strategy: str = "MPS",
    client_memory: int | None = None,
) -> dict[str, Any]:
    """The shared claim of one GPU: its device by uuid and, with MPS, the driver's per-client
    pinned memory limit (``client_memory`` MiB); every pod of a share of this GPU references it.
    With ``TimeSlicing`` no config is given (the driver time-slices a claim's containers)."""
    if strategy not in SHARE_STRATEGIES:
        raise ValueError(f"share strategy must be one of {', '.join(SHARE_STRATEGIES)}")
    device_class, expression = device_selector({"kind": "shared", "gpu": gpu_uuid})
    spec: dict[str, Any] = {
        "devices": {
            "requests": [
                {
                    "name": SERVER_REF,
                    "exactly": {
                        "deviceClassName": device_class,
                        "selectors": [{"cel": {"expression": expression}}],
                    },
                }
            ]
        }
    }
    meta = _metadata(
        shared_claim_name(gpu_uuid), namespace, {SHARED_GPU_KEY: label_value(gpu_uuid)}
    )
    if strategy == "MPS":
        if client_memory is None or client_memory < 1:
            raise ValueError("MPS sharing needs a client memory limit of at least 1 MiB")
        limit = f"{client_memory}Mi"
        spec["devices"]["config"] = [
            {
                "requests": [SERVER_REF],
                "opaque": {
                    "driver": DRIVER,
                    "parameters": {
                        "apiVersion": CONFIG_API_VERSION,
                        "kind": "GpuConfig",
                        "sharing": {
                            "strategy": "MPS",
                            "mpsConfig": {"defaultPinnedDeviceMemoryLimit": limit},
                        },
                    },
                },
            }
        ]
        meta["annotations"] = {CLIENT_MEMORY_KEY: limit}
    return {"apiVersion": API_VERSION, "kind": "ResourceClaim", "metadata": meta, "spec": spec}


def client_memory_of(claim: Mapping[str, Any]) -> str | None:
    """The per-client memory limit a shared claim was made with (None: none)."""
    return ((claim.get("metadata") or {}).get("annotations") or {}).get(CLIENT_MEMORY_KEY)


def claim_refs(lease: Mapping[str, Any], server_claim_name: str | None) -> dict[str, str]:
    """The pod's claims, ``{name in the pod: ResourceClaim name}``: the server claim, or for
    shares the shared claim of each GPU."""
    kind = check_lease(lease)
    if kind != "shared":
        if not server_claim_name:
            raise ValueError("a lease of whole GPUs or MIG slices needs its server claim")
        return {SERVER_REF: server_claim_name}
    gpus = sorted({s["gpu"] for s in lease["slots"]})
    if len(gpus) == 1:
        return {SHARED_REF: shared_claim_name(gpus[0])}
    return {f"{SHARED_REF}-{i}": shared_claim_name(g) for i, g in enumerate(gpus)}


def attach_claims(pod: Any, refs: Mapping[str, str]) -> Any:
    """Add ``refs`` to a pod (KubeSpawner's ``V1Pod``): ``spec.resourceClaims`` and the first
    (notebook) container's ``resources.claims``, keeping its limits and requests (KubeSpawner's
    ``extra_container_config.resources`` would replace them). Entries of the same name are
    replaced, not doubled, so attaching twice changes nothing."""
    from kubernetes_asyncio.client import (
        CoreV1ResourceClaim,
        V1PodResourceClaim,
        V1ResourceRequirements,
    )

    spec = pod.spec
    kept = [c for c in (spec.resource_claims or []) if c.name not in refs]
    spec.resource_claims = kept + [
        V1PodResourceClaim(name=ref, resource_claim_name=claim) for ref, claim in refs.items()
    ]
    container = spec.containers[0]
    if container.resources is None:
        container.resources = V1ResourceRequirements()
    claims = [c for c in (container.resources.claims or []) if c.name not in refs]
    container.resources.claims = claims + [CoreV1ResourceClaim(name=ref) for ref in refs]
    return pod


# -- reading back what was allocated -----------------------------------------------------------


def results(claim: Mapping[str, Any]) -> list[dict[str, Any]]:
    """``status.allocation.devices.results`` of a claim (empty: not allocated yet)."""
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return [dict(r) for r in (allocation.get("devices") or {}).get("results") or ()]


def _value(attribute: Mapping[str, Any] | None) -> Any:
    """The value of a ResourceSlice ``DeviceAttribute`` (one of string/int/bool/version)."""
    for key in ("string", "int", "bool", "version"):
        if attribute and key in attribute:
            return attribute[key]
    return None


def slice_devices(slices: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """The driver's devices in ResourceSlices by ``(pool, device name)``: their attributes
    (values only) and capacities (quantities as written)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for s in slices:
        spec = s.get("spec") or {}
        if spec.get("driver") != DRIVER:
            continue
        pool = (spec.get("pool") or {}).get("name", "")
        for device in spec.get("devices") or ():
            attrs = {k: _value(v) for k, v in (device.get("attributes") or {}).items()}
            caps = {k: (v or {}).get("value") for k, v in (device.get("capacity") or {}).items()}
            counters = {
                name: (value or {}).get("value")
                for use in device.get("consumesCounters") or ()
                for name, value in (use.get("counters") or {}).items()
            }
            out[(pool, device["name"])] = {
                "name": device["name"],
                "pool": pool,
                "node": spec.get("nodeName"),
                "attributes": attrs,
                "capacity": caps,
                "counters": counters,
            }
    return out


def quantity_bytes(quantity: str) -> int:
    """A Kubernetes quantity (``80Gi``, ``85899345920``, ``81920M``) as a whole number."""
    m = _QUANTITY.match(str(quantity).strip())
    if not m or m.group(2) not in _SUFFIX:
        raise ValueError(f"{quantity!r} is not a quantity this code reads")
    return int(Decimal(m.group(1)) * _SUFFIX[m.group(2)])


def memory_slices(device: Mapping[str, Any]) -> list[int]:
    """The memory slices a published MIG device occupies: its ``memorySlice<i>`` capacities
    (static MIG), else the ``memory-slice-<i>`` counters it consumes (dynamic MIG)."""
    for names, prefix in (
        (device.get("capacity") or {}, "memorySlice"),
        (device.get("counters") or {}, "memory-slice-"),
    ):
        found = [
            int(name[len(prefix) :])
            for name in names
            if name.startswith(prefix) and name[len(prefix) :].isdigit()
        ]
        if found:
            return sorted(found)
    return []


def partitioned_gpus(slices: Iterable[Mapping[str, Any]], gpus: Iterable[str]) -> set[str]:
    """Those of ``gpus`` the driver publishes as partitionable (dynamic MIG): a MIG device of
    that parent that consumes counters."""
    wanted = set(gpus)
    return {
        d["attributes"].get("parentUUID")
        for d in slice_devices(slices).values()
        if d["attributes"].get("type") == "mig"
        and d["attributes"].get("parentUUID") in wanted
        and d.get("counters")
    }


def gpu_device(slices: Iterable[Mapping[str, Any]], gpu_uuid: str) -> dict[str, Any] | None:
    """The whole-GPU device of ``gpu_uuid`` the driver publishes (None: not published)."""
    for device in slice_devices(slices).values():
        attrs = device["attributes"]
        if attrs.get("type") == "gpu" and attrs.get("uuid") == gpu_uuid:
            return device
    return None


def allocated_devices(
    claim: Mapping[str, Any], slices: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """What the claim got, one entry per result of this driver, in request order: the request,
    pool and device name, and the device's ``uuid`` (and, for MIG, ``parentUUID``, ``profile``
    and ``start``, its first memory slice) read from the ResourceSlice that published it (None
    where no slice has it)."""
    devices = slice_devices(slices)
    out = []
    for r in results(claim):
        if r.get("driver") != DRIVER:
            continue
        device = devices.get((r.get("pool", ""), r.get("device", ""))) or {}
        attrs = device.get("attributes", {})
        occupied = memory_slices(device)
        out.append(
            {
                "request": r.get("request"),
                "pool": r.get("pool"),
                "device": r.get("device"),
                "type": attrs.get("type"),
                "uuid": attrs.get("uuid"),
                "parent_uuid": attrs.get("parentUUID"),
                "profile": attrs.get("profile"),
                "start": min(occupied) if occupied else None,
            }
        )
    return out


def lease_devices(
    lease: Mapping[str, Any],
    allocated: list[dict[str, Any]],
    partitioned: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The device each slot of ``lease`` actually got, in the lease's terms: ``gpu`` (the GPU's
    uuid: the parent's for a MIG slice), ``mig_uuid``, ``profile``, ``start``; plus
    ``matches``: whether it is the device the pool chose (for MIG: same GPU, profile and
    placement; the instance's uuid may differ where the node made it again; on a GPU of
    ``partitioned``, same GPU and profile: the placement is the scheduler's). Shares are given
    by their GPU's shared claim, whose one result stands for each of its slots."""
    by_request = {str(a["request"]).split("/", 1)[0]: a for a in allocated}
    out = []
    for i, slot in enumerate(lease["slots"]):
        got = by_request.get(f"{SERVER_REF}-{i}") or (
            allocated[0] if slot["kind"] == "shared" and allocated else None
        )
        if got is None:
            out.append(
                {
                    "slot": i,
                    "gpu": None,
                    "mig_uuid": None,
                    "profile": None,
                    "start": None,
                    "matches": False,
                }
            )
            continue
        mig = got.get("type") == "mig"
        gpu = got.get("parent_uuid") if mig else got.get("uuid")
        start = got.get("start") if mig else None
        same_place = not mig or (
            got.get("profile") == slot.get("profile")
            and (slot.get("start") is None or slot["gpu"] in partitioned or start == slot["start"])
        )
        out.append(
            {
                "slot": i,
                "gpu": gpu,
                "mig_uuid": got.get("uuid") if mig else None,
                "profile": got.get("profile") if mig else None,
                "start": start,
                "pool": got.get("pool"),
                "device": got.get("device"),
                "matches": gpu == slot["gpu"] and same_place,
            }
        )
    return out


def rebind_ids(devices: list[dict[str, Any]]) -> list[str] | None:
    """The device ids to rebind a lease to (a MIG slice by its MIG uuid, else the GPU uuid, in
    slot order), or None when nothing is to be rebound: every device is the one the pool chose
    (a MIG instance's new uuid alone is the node's inventory to report, not a move), or a
    slot's device is not known."""
    if all(d["matches"] for d in devices):
        return None
    out = []
    for d in devices:
        device = d.get("mig_uuid") or d.get("gpu")
        if not device:
            return None
        out.append(device)
    return out

"""The DRA backend of ``GPUPoolKubeSpawner``: which backend a cluster has, and the claims' calls.

``GPUPoolKubeSpawner`` mixes this in and calls it at four points: before the pod is built
(``dra_backend``: is it DRA here?), while it is built (``dra_prepare``: create the claims,
reference them), after it runs (``dra_record``: read what was allocated, record it on the
lease) and when it goes (``dra_delete``: the server claim goes with it). The objects come from
``spawner/dra.py`` (pure); here are only the Kubernetes calls, through the spawner's client of
the lease's cluster.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

from kubernetes_asyncio.client import ApiException, ResourceV1Api
from traitlets import Enum, Float
from traitlets.config import Configurable

from jupyterhub_gpupool.poolclient import PoolRefused

from . import dra
from .base import spawn_error


class DeviceTaken(Exception):
    """The claim fell back to a device the pool has granted to another lease meanwhile: the
    server cannot keep it (``message`` says so to the user)."""


class DRAClaims(Configurable):
    """ResourceClaims for the lease's devices (``device_backend``)."""

    device_backend = Enum(
        dra.BACKENDS,
        default_value="auto",
        help="How a GPU pod gets its device. dra: a ResourceClaim that selects exactly the "
        "device the pool chose (Kubernetes Dynamic Resource Allocation, resource.k8s.io/v1, "
        "with NVIDIA's DRA driver); device-plugin: an nvidia.com/* resource in limits and the "
        "node, the plugin picking the device on it; auto: dra where the cluster serves "
        "resource.k8s.io/v1 and has the driver's DeviceClass gpu.nvidia.com, else "
        "device-plugin (probed once per cluster per hub process).",
    ).tag(config=True)

    dra_share_strategy = Enum(
        dra.SHARE_STRATEGIES,
        default_value="MPS",
        help="With DRA, how the pods of a GPU's shared claim share it: MPS (the driver's MPS "
        "with a per-client pinned memory limit of the share's fraction of the GPU's memory: "
        "real memory isolation; needs the driver's MPSSupport feature) or TimeSlicing (no "
        "memory limit).",
    ).tag(config=True)

    dra_allocation_timeout = Float(
        30.0,
        help="Seconds to wait, after the pod runs, for its claim's allocation to be readable "
        "before the lease is left with the pool's own record of the device.",
    ).tag(config=True)

    #: the backend found per API server address, for this process
    _dra_probed: ClassVar[dict[Any, str]] = {}
    #: API servers found with DRA but without the DeviceClass mig.nvidia.com
    _dra_no_mig: ClassVar[set[Any]] = set()
    #: what this server uses now: the backend, its claims by pod reference, its server claim
    _dra_backend_now: str | None = None
    _dra_refs: dict[str, str] | None = None
    _dra_claim: str | None = None
    #: what the claims got (``dra.lease_devices``), saved in the state
    dra_devices: list[dict[str, Any]] | None = None
    #: the lease's GPUs the driver partitions per claim (dynamic MIG)
    _dra_partitioned: list[str] | None = None

    def _resource_api(self) -> ResourceV1Api:
        return ResourceV1Api(self.api.api_client)  # type: ignore[attr-defined]  # the spawner this mixes into has it

    def _as_dict(self, obj: Any) -> dict[str, Any]:
        out: dict[str, Any] = self.api.api_client.sanitize_for_serialization(obj)  # type: ignore[attr-defined]  # the spawner this mixes into has it
        return out

    # -- which backend ---------------------------------------------------------------------

    async def dra_backend(self, cluster: str | None) -> str:
        """``dra`` or ``device-plugin`` for this cluster (``device_backend``, ``auto`` probed
        once: the API group served and the driver's DeviceClass present)."""
        if self.device_backend != "auto":
            self._dra_backend_now = self.device_backend
            return self.device_backend
        host = self._host()
        found = self._dra_probed.get(host)
        if found is None:
            found = await self._probe(host)
            self._dra_probed[host] = found
            self.log.info(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                "GPU backend of cluster %s: %s", cluster or "(default)", found
            )
        self._dra_backend_now = found
        return found

    def _host(self) -> Any:
        return self.api.api_client.configuration.host  # type: ignore[attr-defined]  # the spawner this mixes into has it

    async def _probe(self, host: Any) -> str:
        api = self._resource_api()
        try:
            await api.get_api_resources()
            await api.read_device_class(dra.GPU_CLASS)
            try:
                await api.read_device_class(dra.MIG_CLASS)
                self._dra_no_mig.discard(host)
            except ApiException as e:
                if e.status != 404:
                    raise
                self._dra_no_mig.add(host)
        except ApiException as e:
            if e.status == 404:  # no resource.k8s.io/v1, or no NVIDIA DRA driver
                return "device-plugin"
            if e.status == 403:
                self.log.warning(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                    "The hub may not read DeviceClasses (403): using the device plugin; set "
                    "device_backend = 'dra' or grant get on deviceclasses to use DRA"
                )
                return "device-plugin"
            raise
        return "dra"

    def dra_in_use(self) -> bool:
        return self._dra_backend_now == "dra"

    # -- the claims -------------------------------------------------------------------------

    async def dra_prepare(
        self, lease: dict[str, Any], namespace: str, pod_name: str
    ) -> dict[str, Any]:
        """Create the claims of ``lease`` (the server's own; a share's GPU claim if missing)
        and return the pod's references to them."""
        kind = dra.check_lease(lease)
        if kind == "mig" and self._host() in self._dra_no_mig:
            raise spawn_error(
                f"This cluster's NVIDIA DRA driver has no DeviceClass {dra.MIG_CLASS}, so the "
                "MIG slice the pool granted cannot be claimed; ask an administrator.",
                reason="gpupool_dra_no_mig",
                status=503,
            )
        name = None if kind == "shared" else dra.claim_name(pod_name)
        self._dra_partitioned = []
        if kind == "mig":  # dynamic MIG: the claim names parent and profile, the driver makes it
            gpus = {s["gpu"] for s in lease["slots"]}
            self._dra_partitioned = sorted(dra.partitioned_gpus(await self._slices(), gpus))
        if name is not None:
            claim = dra.server_claim(
                lease, name=name, namespace=namespace, partitioned=self._dra_partitioned
            )
            assert claim is not None  # the server's own claim (a share's is None)
            await self._create_claim(claim, namespace, replace=True)
            self._dra_claim = name
        else:
            for gpu in sorted({s["gpu"] for s in lease["slots"]}):
                milli = max(s.get("milli") or 0 for s in lease["slots"] if s["gpu"] == gpu)
                await self._ensure_shared_claim(gpu, milli, lease, namespace)
        self._dra_refs = dra.claim_refs(lease, name)
        self._dra_namespace = namespace
        return self._dra_refs

    async def _create_claim(
        self, claim: dict[str, Any], namespace: str, *, replace: bool
    ) -> dict[str, Any]:
        api = self._resource_api()
        try:
            return self._as_dict(await api.create_namespaced_resource_claim(namespace, claim))  # type: ignore[arg-type]  # the client sends a dict body as it is
        except ApiException as e:
            if e.status != 409 or not replace:
                raise
        # a claim of this name left by an earlier try of this server: replace it
        await self._delete_claim(claim["metadata"]["name"], namespace)
        return self._as_dict(await api.create_namespaced_resource_claim(namespace, claim))  # type: ignore[arg-type]  # the client sends a dict body as it is

    async def _delete_claim(self, name: str, namespace: str) -> bool:
        try:
            await self._resource_api().delete_namespaced_resource_claim(name, namespace)
        except ApiException as e:
            if e.status == 404:
                return False
            raise
        return True

    async def _slices(self) -> list[dict[str, Any]]:
        found = await self._resource_api().list_resource_slice(
            field_selector=f"spec.driver={dra.DRIVER}"
        )
        return [self._as_dict(s) for s in found.items or ()]

    async def _ensure_shared_claim(
        self, gpu: str, milli: int, lease: dict[str, Any], namespace: str
    ) -> None:
        """The GPU's shared claim, made on its first share. One claim holds one memory limit
        per client: a share of another size than the claim's waits until nobody uses it."""
        memory = None
        if self.dra_share_strategy == "MPS":
            device = dra.gpu_device(await self._slices(), gpu)
            if device is None or "memory" not in device["capacity"]:
                raise spawn_error(
                    f"The NVIDIA DRA driver does not publish GPU {gpu} (node {lease['node']}) "
                    "with its memory; ask an administrator.",
                    reason="gpupool_dra_device",
                    status=503,
                )
            memory = dra.client_memory_mib(dra.quantity_bytes(device["capacity"]["memory"]), milli)
        claim = dra.shared_claim(
            gpu, namespace=namespace, strategy=self.dra_share_strategy, client_memory=memory
        )
        name = claim["metadata"]["name"]
        api = self._resource_api()
        try:
            await api.create_namespaced_resource_claim(namespace, claim)  # type: ignore[arg-type]  # the client sends a dict body as it is
            return
        except ApiException as e:
            if e.status != 409:
                raise
        existing = self._as_dict(await api.read_namespaced_resource_claim(name, namespace))
        if dra.client_memory_of(existing) == dra.client_memory_of(claim):
            return
        if (existing.get("status") or {}).get("reservedFor"):
            raise spawn_error(
                f"GPU {gpu} is shared by servers whose memory limit per client is "
                f"{dra.client_memory_of(existing) or 'none'}, and this share needs "
                f"{dra.client_memory_of(claim) or 'none'}; start again once they stop, or "
                "choose another offer.",
                reason="gpupool_dra_share_size",
                status=409,
            )
        await self._delete_claim(name, namespace)
        await api.create_namespaced_resource_claim(namespace, claim)  # type: ignore[arg-type]  # the client sends a dict body as it is

    async def dra_record(self, lease: dict[str, Any], namespace: str) -> list[dict[str, Any]]:
        """Read what the claims got (waiting up to ``dra_allocation_timeout`` for the
        allocation) and record it on the lease: the spawner's state always, the pool where
        its client can rebind a lease to a device (``PoolClient.rebind``)."""
        api = self._resource_api()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.dra_allocation_timeout
        allocated: list[dict[str, Any]] = []
        claims = list((self._dra_refs or {}).values())
        while True:
            found = [
                self._as_dict(await api.read_namespaced_resource_claim(c, namespace))
                for c in claims
            ]
            if all(dra.results(c) for c in found) or loop.time() >= deadline:
                break
            await asyncio.sleep(0.5)
        slices = await self._slices()
        for claim in found:
            allocated += dra.allocated_devices(claim, slices)
        devices = dra.lease_devices(lease, allocated, self._dra_partitioned or ())
        self.dra_devices = devices
        fallbacks = {(f["gpu"], f.get("start")) for f in dra.fallback_slots(lease)}
        for d in devices:
            if not d["matches"] and (d["gpu"], d["start"]) in fallbacks:
                self.log.info(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                    "Lease %s slot %s: the granted device was taken; the claim fell back to %s",
                    lease["id"],
                    d["slot"],
                    d.get("device"),
                )
            elif not d["matches"]:
                self.log.error(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                    "Lease %s slot %s: the pool chose GPU %s, the cluster allocated %s",
                    lease["id"],
                    d["slot"],
                    lease["slots"][d["slot"]]["gpu"],
                    d.get("device") or "nothing",
                )
        await self._record_on_lease(lease, devices)
        return devices

    async def _record_on_lease(self, lease: dict[str, Any], devices: list[dict[str, Any]]) -> None:
        """Where the allocation is not the device the pool chose, rebind the lease to it:
        ``PoolClient.rebind(lease_id, device)`` with the device's id (a lease of several
        devices: one ``POST allocations/{id}/device`` with them all); without ``rebind`` in
        the client, a warning. A MIG instance with another uuid than recorded, at the chosen
        place, is only logged: the node's inventory reports instances."""
        lease_id = lease["id"]
        for d in devices:
            recorded = lease["slots"][d["slot"]].get("mig_uuid")
            if d["matches"] and d.get("mig_uuid") and recorded and d["mig_uuid"] != recorded:
                self.log.info(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                    "Lease %s slot %s: MIG instance %s at the chosen place (the pool records "
                    "%s: made again?)",
                    lease_id,
                    d["slot"],
                    d["mig_uuid"],
                    recorded,
                )
        ids = dra.rebind_ids(devices)
        if ids is None:
            return
        try:
            # exclusive: one device is one claim's, so another lease's is never swapped
            await self.pool.rebind(lease_id, ids, exclusive=True)  # type: ignore[attr-defined]  # the spawner this mixes into has it
        except PoolRefused as e:
            if e.code != "device_held":
                self.log.error(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                    "Lease %s: recording its allocated devices %s failed: %s", lease_id, ids, e
                )
                return
            chosen = ", ".join(s["gpu"] for s in lease["slots"])
            raise DeviceTaken(
                f"The GPU the pool granted ({chosen}) was taken by another workload before "
                f"this server started, and the device the cluster gave instead "
                f"({', '.join(ids)}) has meanwhile been granted to another server ({e.message}). "
                "The server was stopped; start it again."
            ) from e
        except Exception as e:  # the server runs on it either way: say so, go on
            self.log.error(  # type: ignore[attr-defined]  # the spawner this mixes into has it
                "Lease %s: recording its allocated devices %s failed: %s", lease_id, ids, e
            )

    async def dra_delete(self) -> None:
        """Delete the server claim (a share's GPU claim stays: the pool's, for the next)."""
        name, self._dra_claim = self._dra_claim, None
        namespace = self._dra_namespace
        self._dra_refs = self.dra_devices = None
        if name is not None and namespace is not None:
            await self._delete_claim(name, namespace)

    # -- across hub restarts ------------------------------------------------------------------

    _dra_namespace: str | None = None

    def dra_state(self) -> dict[str, Any]:
        """What a restarted hub needs to delete the claim with the server."""
        if self._dra_backend_now != "dra" or not self._dra_refs:
            return {}
        return {
            "claim": self._dra_claim,
            "namespace": self._dra_namespace,
            "refs": self._dra_refs,
            "devices": self.dra_devices,
        }

    def dra_load(self, state: dict[str, Any] | None) -> None:
        if not state:
            return
        self._dra_backend_now = "dra"
        self._dra_claim = state.get("claim")
        self._dra_namespace = state.get("namespace")
        self._dra_refs = state.get("refs")
        self.dra_devices = state.get("devices")

"""GPUs that pods the pool did not place hold, read from the Kubernetes API.

Each housekeeping round (leader only) reads the cluster and, for every pool node of
``cluster``, tells the store what is held outside the pool, through the service's writer like
every other write, only when it changed (or could not all be marked last time), so a quiet
cluster costs its reads and no write. Two backends, as the spawner has (``backend``):

* device plugin: nodes and pods; what pods other than the pool's own servers hold
  (``kube.pods``), plus the whole GPUs the plugin does not advertise, as counts: the store marks
  that many devices (``pool.outside.place_outside``);
* DRA: nodes, the driver's ResourceSlices and every namespace's ResourceClaims; the exact
  devices claims the pool did not make are allocated, plus those no slice publishes
  (``kube.claims``): the store marks exactly those (``pool.outside.mark_exact``), and a device
  a pool lease holds in its books is reported as a conflict.

When an outside pod ends or its claim is deleted, the next round frees its device.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from traitlets import Bool, Enum, Unicode
from traitlets.config import LoggingConfigurable

from ..pool import commands
from ..pool.outside import WHOLE, Held
from . import claims as kc
from . import pods as kp
from .client import KubeError
from .settings import OneAPIServer, api_traits

log = logging.getLogger("jupyterhub_gpupool.kube")

Call = Callable[[commands.Command], Awaitable[Any]]


class KubeOccupancy(OneAPIServer, LoggingConfigurable):
    """The reader of outside holds (``c.KubeOccupancy`` in the service's config)."""

    enabled = Bool(
        False,
        help="Read the Kubernetes API's pods and nodes every housekeeping round and never grant "
        "a GPU (or MIG instance) that a pod the pool did not place holds, nor one the device "
        "plugin does not advertise. Needs nodes list and pods list (the Helm chart grants them "
        "when it sets this).",
    ).tag(config=True)
    backend = Enum(
        ("auto", "dra", "device-plugin"),
        default_value="auto",
        help="Where outside holds are read. device-plugin: pods' nvidia.com/* requests and "
        "nodes' allocatable (counts; the pool chooses which devices to mark). dra: claims' "
        "allocations and the NVIDIA DRA driver's ResourceSlices (the exact devices; needs "
        "resourceslices list and resourceclaims list). auto: dra once the API serves "
        "resource.k8s.io/v1 ResourceSlices of the driver gpu.nvidia.com, else device-plugin "
        "(asked again each round until found, like the spawner's device_backend).",
    ).tag(config=True)
    cluster = Unicode(
        "default",
        help="The pool cluster whose nodes this API server runs (nodes of other clusters are "
        "left alone).",
    ).tag(config=True)
    api_host, token_file, ca_file = api_traits()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: what was last written per node (counts, holders, exact devices), and nodes left short
        self._sent: dict[str, tuple[dict[str, int], list[str], list[Held] | None]] = {}
        self._short: set[str] = set()
        #: DRA found (backend auto): asked no more
        self._dra_found = False

    async def step(self, store: Any, call: Call) -> dict[str, dict[str, Any]]:
        """One round; returns what each changed node's holds became (for logs and tests).
        An unreachable or refusing API server changes nothing (tried again next round)."""
        pool = store.cluster(self.cluster)
        known = {
            n.name: (
                sorted({p for g in n.gpus if g.mig_enabled for p in g.profiles}),
                sum(1 for g in n.gpus if not g.mig_enabled),
            )
            for n in pool.nodes
        }
        gpus = {
            n.name: [kc.PoolGpu(g.uuid, g.mig_enabled, g.made_starts) for g in n.gpus]
            for n in pool.nodes
        }
        live = set(pool.live)
        if not known:
            return {}
        client = self.client()
        try:
            nodes = {(n.get("metadata") or {}).get("name"): n for n in await client.list_nodes()}
            slices = await self._dra_slices()
            if slices is not None:
                claims = await client.list_resource_claims()
            else:
                pods = await client.list_pods()
        except KubeError as e:
            log.warning("Kubernetes API (outside holds): %s", e)
            return {}
        there = {n: g for n, g in gpus.items() if n in nodes}  # not (yet) a node of this API
        if slices is not None:
            held = kc.outside_devices(slices, claims, there, live)
            return await self._send(
                call, {n: ({}, sorted({h for _, _, h in d}), d) for n, d in held.items()}
            )
        seen = kp.outside_of(pods, {n: p for n, (p, _) in known.items()}, live)
        marks: dict[str, tuple[dict[str, int], list[str], list[Held] | None]] = {}
        for name, (counts, holders) in seen.items():
            node = nodes.get(name)
            if node is None:
                continue
            missing = kp.unadvertised(node, known[name][1])
            if missing:
                counts[WHOLE] = counts.get(WHOLE, 0) + missing
                holders.append(f"(not advertised by the device plugin: {missing})")
            marks[name] = (counts, holders, None)
        return await self._send(call, marks)

    async def _dra_slices(self) -> list[dict[str, Any]] | None:
        """The driver's ResourceSlices where DRA is the backend (None: the device plugin's).
        ``auto`` takes DRA once the API serves slices of the driver."""
        if self.backend == "device-plugin":
            return None
        try:
            slices = await self.client().list_resource_slices(kc.DRIVER)
        except KubeError as e:
            if self.backend == "dra" or self._dra_found or e.status not in (403, 404):
                raise
            return None  # no resource.k8s.io/v1 (404), or not allowed to read it (403)
        if self.backend == "auto" and not self._dra_found:
            if not slices:
                return None
            self._dra_found = True
            log.info("Outside holds of cluster %s: read from DRA ResourceClaims", self.cluster)
        return slices

    async def _send(
        self,
        call: Call,
        marks: dict[str, tuple[dict[str, int], list[str], list[Held] | None]],
    ) -> dict[str, dict[str, Any]]:
        """Write each node's marks that changed (or were short last time)."""
        out: dict[str, dict[str, Any]] = {}
        for name, (counts, holders, devices) in marks.items():
            sent = (counts, holders, devices)
            if self._sent.get(name) == sent and name not in self._short:
                continue
            holds = await call(commands.SetOutside(name, counts, holders, devices))
            self._sent[name] = sent
            if holds.get("short"):
                self._short.add(name)
                for conflict in holds.get("conflicts") or ():
                    log.warning("Node %s: %s", name, conflict)
            else:
                self._short.discard(name)
            out[name] = holds
        return out

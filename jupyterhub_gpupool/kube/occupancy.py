"""GPUs that pods the pool did not place hold, read from the Kubernetes API (device plugin).

Each housekeeping round (leader only) lists the cluster's nodes and pods, and for every pool
node of ``cluster`` finds what pods other than the pool's own servers hold (``kube.pods``),
plus the whole GPUs the device plugin does not advertise. The store marks that many devices
held outside (``pool.outside.place_outside``), through the service's writer like every other
write, only when it changed (or could not all be marked last time), so a quiet cluster costs
two reads a round and no write. When an outside pod ends, the next round frees its device.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from traitlets import Bool, Unicode
from traitlets.config import LoggingConfigurable

from ..pool import commands
from ..pool.outside import WHOLE
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
    cluster = Unicode(
        "default",
        help="The pool cluster whose nodes this API server runs (nodes of other clusters are "
        "left alone).",
    ).tag(config=True)
    api_host, token_file, ca_file = api_traits()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        #: what was last written per node (counts, holders), and nodes left short
        self._sent: dict[str, tuple[dict[str, int], list[str]]] = {}
        self._short: set[str] = set()

    async def step(self, store: Any, call: Call) -> dict[str, dict[str, Any]]:
        """One round; returns what each changed node's holds became (for logs and tests).
        An unreachable or refusing API server changes nothing (tried again next round)."""
        with store.locked() as alloc:
            known = {
                n.name: (
                    sorted({p for g in n.gpus if g.mig_enabled for p in g.model.profiles}),
                    sum(1 for g in n.gpus if not g.mig_enabled),
                )
                for n in alloc.nodes.values()
                if n.cluster == self.cluster
            }
            live = set(alloc.leases)
        if not known:
            return {}
        client = self.client()
        try:
            nodes = {(n.get("metadata") or {}).get("name"): n for n in await client.list_nodes()}
            pods = await client.list_pods()
        except KubeError as e:
            log.warning("Kubernetes API (outside holds): %s", e)
            return {}
        seen = kp.outside_of(pods, {n: p for n, (p, _) in known.items()}, live)
        out: dict[str, dict[str, Any]] = {}
        for name, (counts, holders) in seen.items():
            node = nodes.get(name)
            if node is None:
                continue  # not (yet) a node of this API: nothing to say about it
            missing = kp.unadvertised(node, known[name][1])
            if missing:
                counts[WHOLE] = counts.get(WHOLE, 0) + missing
                holders.append(f"(not advertised by the device plugin: {missing})")
            if self._sent.get(name) == (counts, holders) and name not in self._short:
                continue
            holds = await call(commands.SetOutside(name, counts, holders))
            self._sent[name] = (counts, holders)
            if holds.get("short"):
                self._short.add(name)
            else:
                self._short.discard(name)
            out[name] = holds
        return out

"""Which nodes offer shared GPUs, read from the Kubernetes API (device plugin).

Each housekeeping round (leader only) lists the cluster's nodes and, for every pool node of
``cluster``, whether its device plugin advertises time-slicing (``kube.nodes.advertises_shares``:
``nvidia.com/gpu.shared`` allocatable, gpu-feature-discovery's sharing labels). The node's
non-MIG GPUs then take shares only (it advertises) or whole grants only (it does not)
(``pool.sharing``), written through the service's writer only when a mode changes, so a quiet
cluster costs one read a round and no write. With DRA, shares are the pool's own shared claims
(``spawner.dra``): leave this off there.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

from traitlets import Bool, Unicode
from traitlets.config import LoggingConfigurable

from ..pool import commands
from ..pool.sharing import advertised_modes, changed_modes
from . import nodes as kn
from .client import KubeError
from .settings import OneAPIServer, api_traits

log = logging.getLogger("jupyterhub_gpupool.kube")

Call = Callable[[commands.Command], Awaitable[Any]]


class KubeSharing(OneAPIServer, LoggingConfigurable):
    """The reader of nodes' time-slicing (``c.KubeSharing`` in the service's config)."""

    enabled = Bool(
        False,
        help="Read the Kubernetes API's nodes every housekeeping round and grant shares only on "
        "nodes whose NVIDIA device plugin advertises time-slicing (nvidia.com/gpu.shared, or "
        "gpu-feature-discovery's nvidia.com/gpu.sharing-strategy and nvidia.com/gpu.replicas), "
        "whole GPUs only on the others, whatever the pool config declared. Needs list on nodes "
        "(the Helm chart's occupancy.enabled grants it). For the device-plugin backend; with "
        "DRA, shares are the pool's shared claims.",
    ).tag(config=True)
    cluster = Unicode(
        "default",
        help="The pool cluster whose nodes this API server runs (nodes of other clusters are "
        "left alone).",
    ).tag(config=True)
    api_host, token_file, ca_file = api_traits()

    async def step(self, store: Any, call: Call) -> dict[str, dict[str, str]]:
        """One round; returns the modes that changed per node (for logs and tests). An
        unreachable or refusing API server changes nothing (tried again next round)."""
        pool_nodes = {
            n.name: n
            for n in store.cluster(self.cluster).nodes
            if any(not g.mig_enabled for g in n.gpus)
        }
        if not pool_nodes:
            return {}
        try:
            listed = await self.client().list_nodes()
        except KubeError as e:
            log.warning("Kubernetes API (shared GPUs): %s", e)
            return {}
        out: dict[str, dict[str, str]] = {}
        for node in listed:
            name = str((node.get("metadata") or {}).get("name", ""))
            mine = pool_nodes.get(name)
            if mine is None:
                continue
            modes = changed_modes(mine, advertised_modes(mine, kn.advertises_shares(node)))
            if modes:
                changed: dict[str, str] = await call(commands.SetSharing(name, modes, actor="kube"))
                out[name] = changed
                log.info("Node %s: GPUs now %s", name, ", ".join(sorted(set(modes.values()))))
        return out

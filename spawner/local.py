"""``GPUPoolLocalProcessSpawner``: single-user servers as local processes, pinned by env.

On one machine the pool hands out devices of this host, so pinning is the CUDA environment:
``CUDA_VISIBLE_DEVICES`` and ``NVIDIA_VISIBLE_DEVICES`` name exactly the granted GPU UUIDs or the
``MIG-<uuid>`` of the granted slice. A CPU-only server gets neither device (``-1``/``void``), so
it cannot wander onto a GPU someone else holds.
"""

from __future__ import annotations

from typing import Any

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner
from traitlets import List, Unicode

from .base import GPUPoolSpawnerMixin, spawn_error


def device_env(lease: dict[str, Any] | None) -> dict[str, str]:
    """The CUDA pinning for a lease (``None``: a CPU-only server sees no GPU)."""
    if not lease or not lease.get("slots"):
        return {"CUDA_VISIBLE_DEVICES": "-1", "NVIDIA_VISIBLE_DEVICES": "void"}
    devices = []
    for slot in lease["slots"]:
        if slot.get("kind") == "mig":
            if not slot.get("mig_uuid"):
                raise ValueError(f"lease {lease.get('id')}: MIG slot has no instance yet")
            devices.append(slot["mig_uuid"])
        else:
            devices.append(slot["gpu"])
    visible = ",".join(dict.fromkeys(devices))  # a shared GPU once, in grant order
    env = {"CUDA_VISIBLE_DEVICES": visible, "NVIDIA_VISIBLE_DEVICES": visible}
    shared = [s for s in lease["slots"] if s.get("kind") == "shared"]
    if shared:
        # the share is a promise, not a partition: tell frameworks what to cap themselves at
        env["GPUPOOL_GPU_FRACTION"] = f"{shared[0].get('milli', 1000) / 1000:g}"
    return env


def foreign_node(lease: dict[str, Any], local_nodes: list[str]) -> str | None:
    """The node of ``lease`` when it is not one of ``local_nodes`` (None: local, CPU-only, or
    no restriction)."""
    node = lease.get("node")
    if not local_nodes or not lease.get("slots") or not node or node in local_nodes:
        return None
    return str(node)


class GPUPoolLocalProcessSpawner(GPUPoolSpawnerMixin, LocalProcessSpawner):  # type: ignore[misc]  # jupyterhub ships no type information
    """A LocalProcessSpawner that takes its GPU from the pool (for one-machine hubs)."""

    local_nodes = List(
        Unicode(),
        help="The pool nodes that are this machine (a local process can only use GPUs here). "
        "A lease on any other node is given back and the spawn fails with a message naming "
        "it: in a pool over several machines, set this (and pool_clusters) so the hub never "
        "starts a server pinned to another host's GPU UUIDs. Empty: every node the pool grants "
        "on is this machine (one machine, or the simulated demo pool).",
    ).tag(config=True)

    def check_lease_placement(self, lease: dict[str, Any]) -> None:
        """Refuse a lease on another host: its devices are not on this machine."""
        node = foreign_node(lease, list(self.local_nodes))
        if node is None:
            return
        where = f" in cluster {lease['cluster']}" if lease.get("cluster") else ""
        raise spawn_error(
            f"The GPU pool granted {lease.get('offer')} on node {node}{where}, which is not "
            f"this machine ({', '.join(self.local_nodes)}): a local server cannot use another "
            "host's GPU. The lease was given back; ask an administrator to restrict this hub "
            "to its own nodes (pool_clusters).",
            reason="gpupool_other_host",
            status=409,
        )

    def get_env(self) -> dict[str, str]:
        """JupyterHub's environment plus the lease's devices and ``GPUPOOL_*``."""
        env: dict[str, str] = super().get_env()
        env.update(device_env(self.gpupool_lease))
        env.update(self.gpupool_env())
        return env

    async def start(self) -> Any:
        """Start the process on the granted devices, then bind the lease."""
        url = await super().start()
        await self.bind_lease(url)
        return url


class GPUPoolSimpleLocalProcessSpawner(GPUPoolLocalProcessSpawner, SimpleLocalProcessSpawner):  # type: ignore[misc]  # jupyterhub ships no type information
    """Every user's server runs as the hub's own system user (demos and tests only).

    JupyterHub's ``SimpleLocalProcessSpawner`` with the pool: no system accounts needed, home
    directories from ``home_dir_template`` (``/tmp/{username}`` by default).
    """

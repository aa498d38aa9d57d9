"""Which GPUs may take shares: on Kubernetes with the device plugin, the node says.

With NVIDIA's device plugin a share is a time-slicing replica (``nvidia.com/gpu.shared``),
which exists only on a node whose plugin config turns time-slicing on; with
``renameByDefault: true`` the same node then advertises no ``nvidia.com/gpu`` at all (every GPU
of the node is sliced). So the node, not a request, decides a GPU's mode there: every non-MIG
GPU of a node that advertises sharing is ``shared`` (takes shares only), every one of a node
that does not is ``exclusive`` (whole GPUs only), whatever a pool config declared. Placement
already keeps shares off ``exclusive`` GPUs (``placement.key_options``); these rules say which
GPUs are which and what a user is told when no node offers shares at all.

An agent cannot see a GPU's mode (NVML does not know the plugin's config): its ``auto`` means
"not known here" and keeps the mode the pool learnt (from its config or from the node).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class ModedGpu(Protocol):
    """What the sharing rules read of a GPU (``model.Gpu``, or a store's view of one)."""

    @property
    def uuid(self) -> str: ...
    @property
    def mig_enabled(self) -> bool: ...
    @property
    def sharing(self) -> str: ...


class GpuHolder(Protocol):
    """What the sharing rules read of a node (``model.Node``, or a store's view of one)."""

    @property
    def gpus(self) -> Sequence[ModedGpu]: ...


#: What a user asking for a share is told when no node of the pool (or of their clusters)
#: offers shared GPUs: on Kubernetes, no node's device plugin advertises time-slicing.
NO_SHARED_GPUS = (
    "no node {where} offers shared GPUs (time-slicing) for offer {offer!r}: their GPUs are "
    "whole-GPU only (on Kubernetes, a node offers shares once its NVIDIA device plugin "
    "advertises time-slicing: the label nvidia.com/gpu.sharing-strategy=time-slicing, "
    "resource nvidia.com/gpu.shared)"
)


def advertised_modes(node: GpuHolder, advertised: bool) -> dict[str, str]:
    """The sharing mode each non-MIG GPU of ``node`` must have when its device plugin does
    (``advertised``) or does not advertise shared GPUs. MIG GPUs are left out: a MIG
    instance is never a share here."""
    mode = "shared" if advertised else "exclusive"
    return {g.uuid: mode for g in node.gpus if not g.mig_enabled}


def changed_modes(node: GpuHolder, modes: dict[str, str]) -> dict[str, str]:
    """The entries of ``modes`` that differ from what ``node``'s GPUs have now."""
    have = {g.uuid: g.sharing for g in node.gpus}
    return {u: m for u, m in modes.items() if u in have and have[u] != m}


def reported_mode(reported: str, known: str | None) -> str:
    """A GPU's mode after an agent's inventory report: ``auto`` from an agent is "not known
    here" and keeps ``known`` (the pool config's or the node's), any other mode is taken."""
    if reported == "auto" and known is not None:
        return known
    return reported


def only_exclusive(modes: Iterable[str]) -> bool:
    """Whether GPUs of these modes (the non-MIG GPUs that would otherwise serve a share) are
    all whole-GPU only: then no share can ever be placed on them, and the refusal says why."""
    seen = list(modes)
    return bool(seen) and all(m == "exclusive" for m in seen)


def no_shared_gpus(where: str, offer: str) -> str:
    """The refusal of a share that no node offers (``where``: "in the pool", "in cluster(s)
    …")."""
    return NO_SHARED_GPUS.format(where=where, offer=offer)

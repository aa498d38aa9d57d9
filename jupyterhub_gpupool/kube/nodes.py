"""Kubernetes nodes as the NVIDIA GPU Operator describes them (pure: dicts in, values out).

Facts used (NVIDIA/k8s-device-plugin and mig-parted, copied into
``docs/source/howto/kubernetes-mig.md`` from the project's MIG reference, ``mig_facts.md`` §4):

* strategy ``mixed``: a MIG profile is the resource ``nvidia.com/mig-<profile>`` ("+" becomes
  "."), whole GPUs stay ``nvidia.com/gpu``; gpu-feature-discovery labels
  ``nvidia.com/mig-<profile>.count`` and ``nvidia.com/gpu.product``, ``nvidia.com/gpu.count``;
* mig-manager applies the named config of ``nvidia.com/mig.config`` and reports in
  ``nvidia.com/mig.config.state``: ``pending``, ``rebooting``, ``success`` or ``failed``;
* with time-slicing (or the plugin's MPS) configured, gpu-feature-discovery labels
  ``nvidia.com/gpu.sharing-strategy=time-slicing`` (``mps``; ``none`` otherwise) and
  ``nvidia.com/gpu.replicas=<n>``; with ``renameByDefault: true`` the replicas are the resource
  ``nvidia.com/gpu.shared`` and the node advertises no ``nvidia.com/gpu``;
* mig-parted's default configs are ``all-disabled``, ``all-enabled``, ``all-balanced`` and
  ``all-<profile>`` (every GPU filled with that profile).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ..pool.catalog import GpuModel

MIG_CONFIG = "nvidia.com/mig.config"
MIG_STATE = "nvidia.com/mig.config.state"
MIG_RESOURCE = "nvidia.com/mig-"
GPU_RESOURCE = "nvidia.com/gpu"
#: mig-manager's states that mean "not done yet".
IN_PROGRESS = ("pending", "rebooting")
#: The device plugin's time-slicing replicas with ``renameByDefault: true``.
SHARED_RESOURCE = "nvidia.com/gpu.shared"
#: gpu-feature-discovery's sharing labels: the strategy (``none``, ``time-slicing``, ``mps``)
#: and the replicas per GPU (``1`` when not shared).
SHARING_STRATEGY = "nvidia.com/gpu.sharing-strategy"
REPLICAS = "nvidia.com/gpu.replicas"


def labels(node: Mapping[str, Any]) -> dict[str, str]:
    """A ``Node``'s labels."""
    return dict((node.get("metadata") or {}).get("labels") or {})


def _count(value: object) -> int:
    try:
        return int(str(value))
    except ValueError:
        return 0


def slice_counts(node: Mapping[str, Any]) -> dict[str, int]:
    """MIG devices per profile the device plugin advertises (``status.allocatable``), else
    what gpu-feature-discovery counted (``nvidia.com/mig-<profile>.count``). The profile is
    named as the resource names it (``1g.10gb.me`` for ``1g.10gb+me``)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    out = {
        key[len(MIG_RESOURCE) :]: _count(v)
        for key, v in allocatable.items()
        if key.startswith(MIG_RESOURCE)
    }
    if out:
        return {k: v for k, v in sorted(out.items()) if v}
    for key, value in labels(node).items():
        if key.startswith(MIG_RESOURCE) and key.endswith(".count"):
            out[key[len(MIG_RESOURCE) : -len(".count")]] = _count(value)
    return {k: v for k, v in sorted(out.items()) if v}


def whole_gpus(node: Mapping[str, Any]) -> int:
    """Whole GPUs the device plugin advertises (``nvidia.com/gpu``)."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    return _count(allocatable.get(GPU_RESOURCE, 0))


def resource_profile(profile: str) -> str:
    """The device plugin's name of a profile (``1g.10gb+me`` → ``1g.10gb.me``)."""
    return profile.replace("+", ".")


def default_configs(models: Iterable[GpuModel]) -> dict[str, dict[str, int]]:
    """mig-parted's ``all-*`` configs for these models: name → instances per GPU by profile
    (``all-disabled`` is MIG off: no instances)."""
    out: dict[str, dict[str, int]] = {"all-disabled": {}}
    for model in models:
        for name, profile in model.profiles.items():
            if profile.max_count and profile.compute_slices:
                out.setdefault(f"all-{resource_profile(name)}", {name: profile.max_count})
    return out


def config_for(counts: Mapping[str, int], configs: Mapping[str, Mapping[str, int]]) -> str | None:
    """The config whose per-GPU counts are ``counts`` (None: no config gives it)."""
    wanted = {k: v for k, v in counts.items() if v}
    for name, spec in configs.items():
        if {k: v for k, v in spec.items() if v} == wanted:
            return name
    return None


def layout_counts(layout: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Instances per profile of a layout."""
    out: dict[str, int] = {}
    for profile, _ in layout:
        out[profile] = out.get(profile, 0) + 1
    return out


def failure_message(node: str, config: str, events: Sequence[Mapping[str, Any]]) -> str:
    """Why a re-partition failed, in the node's words where it gave any (its latest warning
    event), else what the state label says."""
    warnings = [e for e in events if e.get("type") == "Warning" and e.get("message")]
    said = f": {warnings[-1]['message']}" if warnings else ""
    return f"mig-manager set {MIG_STATE}=failed applying {config} on node {node}{said}"


def advertises_shares(node: Mapping[str, Any]) -> bool:
    """Whether the node's device plugin serves shared GPUs: replicas in ``allocatable``
    (``nvidia.com/gpu.shared``), or gpu-feature-discovery's labels saying a sharing strategy
    other than ``none`` with more than one replica per GPU. A node saying neither is whole-GPU
    only, whatever a pool config declared."""
    allocatable = (node.get("status") or {}).get("allocatable") or {}
    if _count(allocatable.get(SHARED_RESOURCE, 0)) > 0:
        return True
    have = labels(node)
    strategy = have.get(SHARING_STRATEGY, "none")
    return strategy not in ("", "none") and _count(have.get(REPLICAS, "1")) > 1

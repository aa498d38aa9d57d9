"""GPU nodes as a Kubernetes API server returns them, and what mig-manager does to them.

:func:`kube_node` is a ``Node`` of the GPU Operator (mixed strategy); :data:`FAKE_MIG_CONFIGS`
are the mig-parted configs the fake mig-manager of :class:`tests.fakes.kube.FakeKubeAPI` knows.
"""

from __future__ import annotations

import uuid
from typing import Any

#: mig-parted configs the fake mig-manager knows: name → instances per GPU by profile.
FAKE_MIG_CONFIGS: dict[str, dict[str, int]] = {
    "all-disabled": {},
    "all-1g.10gb": {"1g.10gb": 7},
    "all-3g.40gb": {"3g.40gb": 2},
    "all-7g.80gb": {"7g.80gb": 1},
}


def kube_node(
    name: str,
    *,
    gpus: int = 1,
    product: str = "NVIDIA-A100-SXM4-80GB",
    memory_mib: int = 81920,
    config: str = "all-disabled",
    configs: dict[str, dict[str, int]] = FAKE_MIG_CONFIGS,
    cluster_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ``Node`` as the API server returns it for a GPU node of the GPU Operator (mixed
    strategy): gpu-feature-discovery's labels, the device plugin's allocatable, mig-manager's
    config and state labels (the shape of ``kubectl get node -o json``)."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "resourceVersion": "1",
            "creationTimestamp": "2026-03-01T08:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": str(memory_mib),
                "nvidia.com/gpu.family": "ampere",
                "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.strategy": "mixed",
                **(cluster_labels or {}),
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "64", "memory": "527988848Ki", "pods": "110"},
            "allocatable": {"cpu": "63500m", "memory": "517503088Ki", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2026-03-02T08:59:00Z",
                    "lastTransitionTime": "2026-03-01T08:01:00Z",
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.33.2",
                "containerRuntimeVersion": "containerd://2.0",
            },
        },
    }
    _mig_manager_apply(node, config, configs)
    node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"
    return node


def _mig_manager_apply(node: dict[str, Any], config: str, configs: dict[str, dict[str, int]]):
    """What mig-manager and then the device plugin and gpu-feature-discovery do to a node
    once a config is applied: MIG resources and their labels, per GPU times the GPU count."""
    labels = node["metadata"]["labels"]
    gpus = int(labels.get("nvidia.com/gpu.count", "1"))
    for key in [k for k in labels if k.startswith("nvidia.com/mig-")]:
        del labels[key]
    for where in ("capacity", "allocatable"):
        res = node["status"][where]
        for key in [k for k in res if k.startswith("nvidia.com/mig-") or k == "nvidia.com/gpu"]:
            del res[key]
    per_gpu = configs[config]
    for where in ("capacity", "allocatable"):
        res = node["status"][where]
        if per_gpu:
            for profile, n in per_gpu.items():
                res[f"nvidia.com/mig-{profile.replace('+', '.')}"] = str(n * gpus)
        else:
            res["nvidia.com/gpu"] = str(gpus)
    for profile, n in per_gpu.items():
        labels[f"nvidia.com/mig-{profile.replace('+', '.')}.count"] = str(n * gpus)
    labels["nvidia.com/mig.config"] = config

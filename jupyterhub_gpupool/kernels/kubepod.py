"""The objects of a GPU kernel in its own pod (pure: dicts in, dicts out).

A kernel lease names a node and devices; on Kubernetes the kernel runs in a Pod pinned to that
node (``nodeSelector``) holding those devices, exactly as a server's pod does
(``spawner/objects.py``, ``spawner/dra.py``, whose builders are reused here): with Dynamic
Resource Allocation a ResourceClaim whose CEL selector names the granted device
(:func:`kernel_claim`), else the device plugin's ``nvidia.com/*`` limit. The container runs
``python -m jupyterhub_gpupool.kernels.launcher``, which opens the kernel's ports in the pod and
sends its connection info back to the server (``kernels/launcher.py``). Tested against the
Kubernetes schemas (kubernetes-validate) and the fake API server.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from ..spawner import dra, objects
from .launcher import POD_IP_ENV, TOKEN_ENV

#: Labels of a kernel pod (and its claim): which kernel, and who made it.
KERNEL_LABEL = "gpupool.jupyter.org/kernel"
MANAGED = {"app.kubernetes.io/managed-by": "jupyterhub-gpupool"}
#: The pod's name for its claim, and the container's name.
CLAIM_REF = "gpu"
CONTAINER = "kernel"
LAUNCHER_MODULE = "jupyterhub_gpupool.kernels.launcher"
BACKENDS = ("device-plugin", "dra")
_ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*\Z")


def pod_name(kernel_id: str) -> str:
    """A fresh pod name (a DNS label) for one launch of ``kernel_id``: a restarted kernel's
    old pod may still be terminating under the previous one."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", kernel_id.lower())[:36].strip("-") or "kernel"
    return f"gpupool-kernel-{cleaned}-{secrets.token_hex(3)}"


def kernel_claim(lease: Mapping[str, Any], name: str, namespace: str) -> dict[str, Any]:
    """The ResourceClaim of a kernel lease's devices (the spawner's server claim: each slot
    selects exactly its device), labelled with the kernel. A GPU share has none: its GPU's
    shared claim is the spawner's (``ValueError``)."""
    claim: dict[str, Any] | None = dra.server_claim(lease, name=name, namespace=namespace)
    if claim is None:
        raise ValueError(
            "a GPU share has no claim of its own with DRA: run shared-GPU kernels with "
            "device_backend 'device-plugin'"
        )
    return claim


def _env(values: Mapping[str, str]) -> list[dict[str, Any]]:
    bad = [k for k in values if not _ENV_NAME.match(k)]
    if bad:
        raise ValueError(f"not an environment variable name: {', '.join(sorted(bad))}")
    return [{"name": k, "value": str(v)} for k, v in sorted(values.items())]


def kernel_pod(
    lease: Mapping[str, Any],
    *,
    name: str,
    namespace: str,
    kernel_id: str,
    image: str,
    python: str,
    response_address: str,
    token: str,
    env: Mapping[str, str],
    backend: str = "device-plugin",
    claim_name: str | None = None,
    node_label: str = "kubernetes.io/hostname",
    tolerations: Sequence[Mapping[str, Any]] = objects.DEFAULT_GPU_TOLERATIONS,
    mig_strategy: str = "mixed",
    service_account: str = "",
    volume: Mapping[str, Any] | None = None,
    mount_path: str = "",
    working_dir: str = "",
    grace_seconds: int = 10,
    pull_policy: str = "IfNotPresent",
) -> dict[str, Any]:
    """The Pod of one GPU kernel on the lease's node with its devices.

    ``volume``: a Kubernetes volume source (e.g. ``{"persistentVolumeClaim": {"claimName":
    ...}}``) mounted at ``mount_path``; ``working_dir`` the kernel's directory in the pod.
    The service account's token is not mounted: the kernel does not call the API.
    """
    if backend not in BACKENDS:
        raise ValueError(f"device backend must be one of {', '.join(BACKENDS)}")
    objects.check_lease(lease)
    if not image:
        raise ValueError("no image for the kernel pod")
    labels = {
        **MANAGED,
        KERNEL_LABEL: objects.label_value(kernel_id),
        objects.LEASE_KEY: objects.label_value(str(lease["id"])),
        objects.OFFER_KEY: objects.label_value(str(lease["offer"])),
    }
    annotations = {objects.LEASE_KEY: str(lease["id"]), objects.NODE_KEY: str(lease["node"])}
    variables = _env({**env, "GPUPOOL_KERNEL_LEASE": str(lease["id"]), TOKEN_ENV: token})
    variables.append({"name": POD_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": pull_policy,
        "command": [python, "-m", LAUNCHER_MODULE],
        "args": ["--response-address", response_address, "--kernel-id", kernel_id],
        "env": variables,
    }
    spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": grace_seconds,
        "nodeSelector": {node_label: str(lease["node"])},
        "tolerations": [dict(t) for t in tolerations],
        "containers": [container],
    }
    if service_account:
        spec["serviceAccountName"] = service_account
    if backend == "dra":
        if not claim_name:
            raise ValueError("a DRA kernel pod needs its claim")
        spec["resourceClaims"] = [{"name": CLAIM_REF, "resourceClaimName": claim_name}]
        container["resources"] = {"claims": [{"name": CLAIM_REF}]}
    else:
        limits = objects.device_resource(lease, mig_strategy=mig_strategy)
        container["resources"] = {"limits": limits}
    if volume:
        if not mount_path:
            raise ValueError("a home volume needs its mount path")
        spec["volumes"] = [{"name": "home", **dict(volume)}]
        container["volumeMounts"] = [{"name": "home", "mountPath": mount_path}]
    if working_dir:
        container["workingDir"] = working_dir
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": spec,
    }


def owned_by(obj: dict[str, Any], owner: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with the pod ``owner`` (its name and uid) as its owner: Kubernetes' garbage
    collector deletes it when that pod goes (an owner must be in the same namespace)."""
    meta = owner.get("metadata") or {}
    ref = {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}
    obj["metadata"]["ownerReferences"] = [ref]
    return obj


def pod_exit(pod: Mapping[str, Any] | None) -> int | None:
    """The kernel's exit status from its pod: None while it may run (Pending, Running), the
    container's exit code once it ended (1 for a pod that failed without one), 0 for a pod
    gone (deleted)."""
    if pod is None:
        return 0
    status = pod.get("status") or {}
    phase = status.get("phase")
    if phase not in ("Succeeded", "Failed"):
        return None
    for cs in status.get("containerStatuses") or ():
        ended = (cs.get("state") or {}).get("terminated")
        if cs.get("name") == CONTAINER and ended and ended.get("exitCode") is not None:
            return int(ended["exitCode"])
    return 0 if phase == "Succeeded" else 1


def why_not_running(pod: Mapping[str, Any]) -> str:
    """What the pod's conditions and container states say about why it is not running."""
    status = pod.get("status") or {}
    parts = []
    for c in status.get("conditions") or ():
        if c.get("status") == "False" and (c.get("reason") or c.get("message")):
            parts.append(f"{c.get('type')}: {c.get('message') or c.get('reason')}")
    for cs in status.get("containerStatuses") or ():
        for state in ("waiting", "terminated"):
            got = (cs.get("state") or {}).get(state)
            if got and (got.get("reason") or got.get("message")):
                parts.append(f"{state}: {got.get('reason')} {got.get('message') or ''}".strip())
    return "; ".join(parts) or f"phase {status.get('phase') or 'unknown'}"

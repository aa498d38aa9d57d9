"""Kubernetes pod fragments for a pool lease: pure functions returning KubeSpawner trait values.

The pool decides *which* node and device a server gets; on Kubernetes that decision becomes
trait values of KubeSpawner (``extra_resource_limits``, ``node_selector``, ``tolerations``,
``extra_labels``, ...), in the Kubernetes API's camelCase JSON shape that KubeSpawner passes
through to the pod. Nothing here does I/O or needs a Kubernetes client, so every function is
tested against literal dicts (tests/unit/test_kube_objects.py), the way KubeSpawner tests
``make_pod``.

Two rules shape the output:

- **GPUs go in limits.** Kubernetes extended resources (``nvidia.com/gpu``, MIG devices) may be
  given in ``limits`` alone; a request must equal the limit, and a request without a limit is
  refused (https://kubernetes.io/docs/tasks/manage-gpus/scheduling-gpus/). So GPU resources are
  put in ``extra_resource_limits`` and *removed* from ``extra_resource_guarantees``.
- **Values are KubeSpawner templates.** KubeSpawner runs ``str.format`` over
  ``extra_labels``, ``extra_annotations`` and ``environment`` values (``{username}`` ...), so the
  braces of a JSON annotation would break the spawn; every value made here has ``{``/``}``
  doubled.

The functions take the spawner's *current* trait values and return whole new values (inputs are
never mutated): whatever a previous lease or a GPU profile put there (GPU resources, the node pin,
GPU tolerations, ``gpupool.jupyter.org/*`` labels, ``GPUPOOL_*`` variables) is removed first, so
nothing of a GPU spawn leaks into the next one (the stale-override bug class of KubeSpawner,
jupyterhub/kubespawner#546).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

#: Prefix of the labels and annotations the pool puts on pods.
PREFIX = "gpupool.jupyter.org/"
LEASE_KEY = PREFIX + "lease"
OFFER_KEY = PREFIX + "offer"
NODE_KEY = PREFIX + "node"
SLOTS_KEY = PREFIX + "slots"
DISPLAY_NAME_KEY = PREFIX + "offer-display-name"

#: Server environment (a contract: the lab extension reads it). On Kubernetes the device
#: variables are the device plugin's.
ENV_LEASE_ID = "GPUPOOL_LEASE_ID"
ENV_OFFER = "GPUPOOL_OFFER"
ENV_API_URL = "GPUPOOL_API_URL"
DEVICE_ENV = ("CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES")

SLOT_KINDS = ("gpu", "mig", "shared")
#: The NVIDIA device plugin's ``--mig-strategy`` values.
MIG_STRATEGIES = ("none", "single", "mixed")

GPU_RESOURCE = "nvidia.com/gpu"
#: Time-slicing (or MPS) with ``renameByDefault: true`` advertises replicas under the resource
#: name plus ``.shared`` (k8s-device-plugin api/config/v1/consts.go,
#: ``DefaultSharedResourceNameSuffix``), and leaves ``nvidia.com/gpu`` meaning a whole GPU.
DEFAULT_SHARED_RESOURCE = "nvidia.com/gpu.shared"
#: Resource names (prefixes) that are GPUs: removed from CPU-only pods and replaced on GPU pods.
GPU_RESOURCE_PREFIXES = ("nvidia.com/", "amd.com/gpu", "gpu.intel.com/")
#: Lets the pod onto nodes tainted ``nvidia.com/gpu`` (GKE taints GPU node pools so; many copy it).
DEFAULT_GPU_TOLERATIONS = ({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},)
#: The traits ``pod_overrides`` and ``cpu_only_overrides`` return (and read from ``current``).
OVERRIDDEN_TRAITS = (
    "extra_resource_limits",
    "extra_resource_guarantees",
    "node_selector",
    "node_affinity_required",
    "tolerations",
    "extra_labels",
    "extra_annotations",
    "environment",
)

_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"{_DNS_LABEL}(\.{_DNS_LABEL})*\Z")
_QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?\Z")
_LABEL_VALUE = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?\Z")
_WHOLE_NUMBER = re.compile(r"[1-9][0-9]*\Z")


def _resource_name_ok(name: str) -> bool:
    """An extended resource name: ``domain/name``, DNS-subdomain domain, qualified name."""
    domain, sep, local = name.partition("/")
    return bool(
        sep
        and len(domain) <= 253
        and _DNS_SUBDOMAIN.match(domain)
        and len(local) <= 63
        and _QUALIFIED_NAME.match(local)
    )


def _template(value: str) -> str:
    """Escape ``value`` for KubeSpawner's ``str.format`` expansion."""
    return value.replace("{", "{{").replace("}", "}}")


def check_lease(lease: Mapping[str, Any]) -> str:
    """Raise ``ValueError`` unless ``lease`` can be placed on a pod; return its slot kind.

    A pod needs a node and at least one device, all of one kind (an offer is of one kind).
    """
    if not isinstance(lease, Mapping):
        raise ValueError(f"a lease is a JSON object, not {type(lease).__name__}")
    lease_id = lease.get("id")
    if not isinstance(lease_id, str) or not lease_id:
        raise ValueError("lease has no id")
    if lease.get("state") in ("queued", "released"):
        raise ValueError(f"lease {lease_id} is {lease['state']}: it holds no device")
    for key in ("offer", "node"):
        if not isinstance(lease.get(key), str) or not lease[key]:
            raise ValueError(f"lease {lease_id} has no {key}")
    slots = lease.get("slots")
    if not isinstance(slots, list) or not slots:
        raise ValueError(f"lease {lease_id} has no slots")
    kinds: set[str] = set()
    for i, slot in enumerate(slots):
        if not isinstance(slot, Mapping):
            raise ValueError(f"lease {lease_id}: slot {i} is not an object")
        kind = slot.get("kind")
        if kind not in SLOT_KINDS:
            raise ValueError(
                f"lease {lease_id}: slot {i} has unknown kind {kind!r} "
                f"(one of {', '.join(SLOT_KINDS)})"
            )
        if kind == "mig" and (not isinstance(slot.get("profile"), str) or not slot["profile"]):
            raise ValueError(f"lease {lease_id}: MIG slot {i} has no profile")
        kinds.add(kind)
    if len(kinds) > 1:
        raise ValueError(f"lease {lease_id} mixes slot kinds {sorted(kinds)}")
    return kinds.pop()


def mig_resource_name(profile: str) -> str:
    """The resource the NVIDIA device plugin advertises for a MIG profile (``mixed`` strategy).

    The plugin names it ``"mig-" + profile`` with every ``+`` turned into ``.``, because a
    resource name allows only ``[-a-z0-9.]``: ``1g.10gb`` → ``nvidia.com/mig-1g.10gb``,
    ``1g.10gb+me`` → ``nvidia.com/mig-1g.10gb.me`` (NVIDIA/k8s-device-plugin
    internal/rm/rm.go, ``AddDefaultResourcesToConfig``:
    ``strings.ReplaceAll("mig-"+p.String(), "+", ".")``).
    """
    name = f"nvidia.com/mig-{profile.replace('+', '.')}"
    # the plugin's own check (api/config/v1/resources.go, NewResourceName): at most 63
    # characters in all, and the part after the slash a DNS subdomain (so lower case)
    if len(name) > 63 or not _DNS_SUBDOMAIN.match(name.partition("/")[2]):
        raise ValueError(f"MIG profile {profile!r} gives no valid resource name ({name!r})")
    return name


def device_resource(
    lease: Mapping[str, Any],
    *,
    mig_strategy: str = "mixed",
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
    mig_resource_names: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The device-plugin resources (for ``limits``) that give the pod the lease's devices.

    Whole GPUs: ``nvidia.com/gpu`` times the slot count. MIG: ``nvidia.com/mig-<profile>`` per
    profile with ``mixed``, ``nvidia.com/gpu`` with ``single`` (the plugin then advertises the
    node's uniform MIG devices as GPUs). Shared: one replica of ``shared_resource`` per slot —
    a time-sliced replica grants no fixed share, so asking for more than one gains nothing.
    ``mig_resource_names`` maps a profile to a resource name where a cluster renames them.
    """
    kind = check_lease(lease)
    if mig_strategy not in MIG_STRATEGIES:
        raise ValueError(
            f"mig_strategy must be one of {', '.join(MIG_STRATEGIES)}, not {mig_strategy!r}"
        )
    slots = lease["slots"]
    if kind == "gpu":
        return {GPU_RESOURCE: str(len(slots))}
    if kind == "shared":
        if not _resource_name_ok(shared_resource):
            raise ValueError(f"shared_resource {shared_resource!r} is not a resource name")
        return {shared_resource: str(len(slots))}
    if mig_strategy == "none":
        raise ValueError(
            f"lease {lease['id']} holds MIG slices, but with mig_strategy 'none' the device "
            "plugin advertises no MIG devices"
        )
    if mig_strategy == "single":
        return {GPU_RESOURCE: str(len(slots))}
    names = mig_resource_names or {}
    for profile, name in names.items():
        if not _resource_name_ok(name):
            raise ValueError(f"mig_resource_names[{profile!r}] {name!r} is not a resource name")
    counts = Counter(names.get(s["profile"]) or mig_resource_name(s["profile"]) for s in slots)
    return {name: str(n) for name, n in sorted(counts.items())}


def _is_gpu(name: str, prefixes: Iterable[str]) -> bool:
    return any(str(name).startswith(p) for p in prefixes)


def strip_gpu_resources(
    limits: Mapping[str, Any] | None,
    guarantees: Mapping[str, Any] | None,
    *,
    prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Copies of ``limits`` and ``guarantees`` without any GPU resource.

    For CPU-only servers, so a GPU left by a profile's ``kubespawner_override`` or a previous
    spawn never reaches the pod (jupyterhub/kubespawner#546), and before a lease's own device
    is added, so a pod never asks for two kinds of GPU.
    """
    return (
        {k: v for k, v in (limits or {}).items() if not _is_gpu(k, prefixes)},
        {k: v for k, v in (guarantees or {}).items() if not _is_gpu(k, prefixes)},
    )


def label_value(value: str) -> str:
    """``value`` as a valid label value (≤ 63 of ``[A-Za-z0-9-_.]``, alphanumeric ends).

    Valid values pass unchanged; others are cleaned, cut and suffixed with a hash of the
    original so that two different values never share a label.
    """
    if len(value) <= 63 and _LABEL_VALUE.match(value):
        return value
    digest = hashlib.sha256(value.encode()).hexdigest()[:8]
    cleaned = re.sub(r"[^A-Za-z0-9_.-]+", "-", value)
    cleaned = re.sub(r"^[^A-Za-z0-9]+|[^A-Za-z0-9]+$", "", cleaned)[:54]
    cleaned = re.sub(r"[^A-Za-z0-9]+$", "", cleaned)
    return f"{cleaned}-{digest}" if cleaned else digest


def _node_field(node: str) -> dict[str, Any]:
    return {"key": "metadata.name", "operator": "In", "values": [node]}


def _terms(value: Any) -> list[dict[str, Any]]:
    """NodeSelectorTerms of a ``node_affinity_required`` value (KubeSpawner: list or dict)."""
    if isinstance(value, Mapping):
        return [dict(value[k]) for k in sorted(value)]
    return [dict(t) for t in value or ()]


def _without(items: Any, unwanted: Sequence[Mapping[str, Any]]) -> Any:
    """A ``tolerations``-like value (a list, or KubeSpawner's dict form) without ``unwanted``."""
    if isinstance(items, Mapping):
        return {k: v for k, v in items.items() if v not in unwanted}
    return [t for t in items or () if t not in unwanted]


def _cleaned(
    current: Mapping[str, Any] | None,
    gpu_tolerations: Sequence[Mapping[str, Any]],
    prefixes: Sequence[str],
) -> dict[str, Any]:
    """``current`` trait values with everything a lease or a GPU profile adds removed."""
    cur = current or {}
    limits, guarantees = strip_gpu_resources(
        cur.get("extra_resource_limits"), cur.get("extra_resource_guarantees"), prefixes=prefixes
    )
    annotations = dict(cur.get("extra_annotations") or {})
    pinned = annotations.get(NODE_KEY)
    node_selector = {
        k: v for k, v in (cur.get("node_selector") or {}).items() if not pinned or v != pinned
    }
    terms = _terms(cur.get("node_affinity_required"))
    if pinned:
        for term in terms:
            if "matchFields" in term:
                term["matchFields"] = [f for f in term["matchFields"] if f != _node_field(pinned)]
                if not term["matchFields"]:
                    del term["matchFields"]
        terms = [t for t in terms if t]
    drop_env = {ENV_LEASE_ID, ENV_OFFER, *DEVICE_ENV}
    return {
        "extra_resource_limits": limits,
        "extra_resource_guarantees": guarantees,
        "node_selector": node_selector,
        "node_affinity_required": terms,
        "tolerations": _without(cur.get("tolerations"), gpu_tolerations),
        "extra_labels": {
            k: v for k, v in (cur.get("extra_labels") or {}).items() if not k.startswith(PREFIX)
        },
        "extra_annotations": {k: v for k, v in annotations.items() if not k.startswith(PREFIX)},
        "environment": {
            k: v for k, v in (cur.get("environment") or {}).items() if k not in drop_env
        },
    }


def pod_overrides(
    lease: Mapping[str, Any],
    *,
    api_url: str,
    current: Mapping[str, Any] | None = None,
    offer: Mapping[str, Any] | None = None,
    node_label: str | None = "kubernetes.io/hostname",
    gpu_tolerations: Sequence[Mapping[str, Any]] = DEFAULT_GPU_TOLERATIONS,
    mig_strategy: str = "mixed",
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
    mig_resource_names: Mapping[str, str] | None = None,
    gpu_resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES,
) -> dict[str, Any]:
    """The trait values (``OVERRIDDEN_TRAITS``) that put a server on its lease's devices.

    ``current`` holds the spawner's present values of those traits; the result keeps what is
    not the pool's (memory limits, other labels, admin tolerations ...) and adds: the device
    resource in limits (none in guarantees), the lease's node (``node_label: node`` in the node
    selector, or with ``node_label=None`` a ``metadata.name`` field in every required
    node-affinity term, for clusters whose hostname label is not the node name), the GPU
    tolerations, ``gpupool.jupyter.org/{lease,offer}`` labels, annotations (lease, offer, node,
    slots as JSON, the offer's display name when ``offer`` is given) and the ``GPUPOOL_*``
    variables. The device plugin picks the device on that node: the pool's exact slot is
    advisory there, its accounting holds because the per-node counts agree.
    """
    resources = device_resource(
        lease,
        mig_strategy=mig_strategy,
        shared_resource=shared_resource,
        mig_resource_names=mig_resource_names,
    )
    if offer is not None and offer.get("name") != lease["offer"]:
        raise ValueError(f"offer {offer.get('name')!r} is not the lease's offer {lease['offer']!r}")
    gpu_tolerations = [dict(t) for t in gpu_tolerations]
    out = _cleaned(current, gpu_tolerations, (*gpu_resource_prefixes, *resources))
    node = lease["node"]

    out["extra_resource_limits"].update(resources)
    if node_label is None:
        terms = out["node_affinity_required"] or [{}]
        for term in terms:
            term["matchFields"] = [*term.get("matchFields", ()), _node_field(node)]
        out["node_affinity_required"] = terms
    else:
        out["node_selector"][node_label] = node

    tolerations = out["tolerations"]
    if isinstance(tolerations, dict):
        for i, tol in enumerate(gpu_tolerations):
            tolerations[f"gpupool-{i}"] = tol
    else:
        tolerations.extend(gpu_tolerations)

    out["extra_labels"].update(
        {LEASE_KEY: label_value(lease["id"]), OFFER_KEY: label_value(lease["offer"])}
    )
    annotations = {
        LEASE_KEY: lease["id"],
        OFFER_KEY: lease["offer"],
        NODE_KEY: node,
        SLOTS_KEY: json.dumps(lease["slots"], separators=(",", ":"), sort_keys=True),
    }
    if offer is not None and offer.get("display_name"):
        annotations[DISPLAY_NAME_KEY] = str(offer["display_name"])
    out["extra_annotations"].update({k: _template(v) for k, v in annotations.items()})
    out["environment"].update(
        {
            ENV_LEASE_ID: _template(lease["id"]),
            ENV_OFFER: _template(lease["offer"]),
            ENV_API_URL: _template(api_url),
        }
    )
    return out


def cpu_only_overrides(
    *,
    current: Mapping[str, Any] | None = None,
    api_url: str | None = None,
    gpu_tolerations: Sequence[Mapping[str, Any]] = DEFAULT_GPU_TOLERATIONS,
    hide_gpus: bool = True,
    shared_resource: str = DEFAULT_SHARED_RESOURCE,
    gpu_resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES,
) -> dict[str, Any]:
    """The trait values (``OVERRIDDEN_TRAITS``) for a server without a GPU.

    Removes every GPU resource, the node pin and labels of an earlier lease, and the GPU
    tolerations (a CPU-only server has no business on a tainted GPU node). ``hide_gpus`` sets
    ``NVIDIA_VISIBLE_DEVICES=void``: where the NVIDIA runtime is the node's default, a CUDA
    image (which sets ``NVIDIA_VISIBLE_DEVICES=all``) would otherwise see every GPU of the node
    without asking the device plugin (NVIDIA/k8s-device-plugin#61). ``api_url`` sets
    ``GPUPOOL_API_URL`` so the lab extension can still show quota and ask for a GPU. GPU
    resources are those under ``gpu_resource_prefixes`` plus ``shared_resource``.
    """
    prefixes = (*gpu_resource_prefixes, shared_resource)
    out = _cleaned(current, [dict(t) for t in gpu_tolerations], prefixes)
    if api_url is not None:
        out["environment"][ENV_API_URL] = _template(api_url)
    if hide_gpus:
        out["environment"]["NVIDIA_VISIBLE_DEVICES"] = "void"
    return out


def _label_problems(labels: Mapping[str, Any]) -> list[str]:
    problems = []
    for key, value in labels.items():
        prefix, _, name = str(key).rpartition("/")
        if (prefix and not (len(prefix) <= 253 and _DNS_SUBDOMAIN.match(prefix))) or not (
            len(name) <= 63 and _QUALIFIED_NAME.match(name)
        ):
            problems.append(f"label key {key!r} is not valid")
        if not isinstance(value, str) or len(value) > 63 or not _LABEL_VALUE.match(value):
            problems.append(f"label {key}={value!r} is not a valid label value")
    return problems


def with_runtime_class(
    extra_pod_config: Mapping[str, Any], runtime_class: str, *, gpu: bool
) -> dict[str, Any]:
    """KubeSpawner's ``extra_pod_config`` with ``runtimeClassName`` for a GPU pod (the NVIDIA
    container runtime where it is not the nodes' default, e.g. the GPU Operator's ``nvidia``),
    and without it on a CPU-only pod when it is that class (left from an earlier GPU spawn of
    this spawner; a class set for every pod stays). A new dict; the input is not changed."""
    out = dict(extra_pod_config)
    if gpu and runtime_class:
        out["runtimeClassName"] = runtime_class
    elif not gpu and runtime_class and out.get("runtimeClassName") == runtime_class:
        del out["runtimeClassName"]
    return out


def check_pod_manifest(
    manifest: Mapping[str, Any], *, gpu_resource_prefixes: Sequence[str] = GPU_RESOURCE_PREFIXES
) -> None:
    """Raise ``ValueError`` for what the API server or scheduler would refuse and schemas miss.

    The Kubernetes JSON schemas accept any label string and any quantity; the API server does
    not: label values are checked, and every GPU resource must be a whole number in ``limits``,
    with a request (if any) equal to it. ``manifest`` is the serialized (camelCase) pod.
    """
    problems = _label_problems((manifest.get("metadata") or {}).get("labels") or {})
    spec = manifest.get("spec") or {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        name = container.get("name")
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = resources.get("requests") or {}
        for res, qty in limits.items():
            if _is_gpu(res, gpu_resource_prefixes) and not _WHOLE_NUMBER.match(str(qty)):
                problems.append(f"container {name}: {res} limit {qty!r} is not a whole number")
        for res, qty in requests.items():
            if not _is_gpu(res, gpu_resource_prefixes):
                continue
            if res not in limits:
                problems.append(f"container {name}: {res} is requested but has no limit")
            elif str(limits[res]) != str(qty):
                problems.append(f"container {name}: {res} request {qty!r} != limit {limits[res]!r}")
    if problems:
        raise ValueError("; ".join(problems))

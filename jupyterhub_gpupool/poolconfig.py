"""The pool config file (YAML): nodes, offers and quotas, validated with errors that name the path.

Example::

    nodes:
      - name: gpu-a
        cpu_milli: 64000
        memory_mib: 524288
        gpus:
          - {model: A100-80GB, count: 2, mig: {enabled: true, dynamic: true}}
    offers:
      - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
    quotas:
      default: {guarantee: 0, limit: 2}
      groups: {ml: {guarantee: 4, limit: 8}}
    reclaim:
      default: {idle_timeout: 1h, warn_before: 10m}
      offers: {a100-1g: {idle_timeout: 30m}}
    prices:
      currency: EUR
      models: {A100-80GB: {held: 2.40, busy: 1.90}, H100-80GB: 3.10}
    classes:
      training: {grace: 600, allowed_groups: [ml]}
    borrowing:
      keep_free: 2          # or per GPU model: {H100-80GB: 2}
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from .pool.catalog import Catalog
from .pool.errors import ConfigError, PoolError
from .pool.headroom import Headroom, parse_borrowing
from .pool.limits import (
    MAX_GPUS,
    MAX_GPUS_PER_NODE,
    MAX_INT,
    MAX_LABELS,
    MAX_NAME,
    MAX_NODES,
    MAX_OFFERS,
    MAX_QUOTAS,
    bad_character,
    check_count,
    check_name,
    shown,
)
from .pool.miglayout import validate_mig_layout
from .pool.model import SHARING_MODES, Gpu, MigInstance, Node, Offer, parse_offer
from .pool.pricing import Prices, parse_prices
from .pool.quota import QuotaSpec
from .pool.reclaimpolicy import PolicySet, parse_policies
from .pool.workloads import DEFAULT_CLASSES, WorkloadClass, parse_classes

#: The cluster of a node nobody placed in one (one machine, or a single cluster).
DEFAULT_CLUSTER = "default"
#: A cluster name is a DNS label (RFC 1123), as Kubernetes names are.
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def check_cluster_name(name: object, field: str) -> str:
    """``name`` if it is a DNS label, else a ConfigError naming ``field``."""
    if not isinstance(name, str) or not DNS_LABEL.fullmatch(name):
        raise ConfigError(
            f"{name!r} is not a DNS label (lower-case letters, digits and '-', at most 63)",
            field=field,
        )
    return name


def parse_clusters(raw: object) -> tuple[str, ...]:
    """Validate the ``clusters`` list (names, unique)."""
    if raw is None:
        return (DEFAULT_CLUSTER,)
    if not isinstance(raw, list) or not raw:
        raise ConfigError("must be a non-empty list of cluster names", field="clusters")
    names = [check_cluster_name(c, f"clusters[{i}]") for i, c in enumerate(raw)]
    if len(set(names)) != len(names):
        raise ConfigError("a cluster is named twice", field="clusters")
    return tuple(names)


def check_known(cluster: str, known: tuple[str, ...], field: str) -> None:
    """A ConfigError (code ``unknown_cluster``, the known list allowed) unless known."""
    if cluster not in known:
        raise ConfigError(
            f"unknown cluster {cluster!r}: the pool knows {', '.join(known)}",
            field=field,
            allowed=list(known),
            code="unknown_cluster",
        )


@dataclass(frozen=True)
class PoolConfig:
    """What the pool config file declares (validated)."""

    nodes: tuple[Node, ...] = ()
    offers: tuple[Offer, ...] = ()
    users: Mapping[str, QuotaSpec] = field(default_factory=dict)
    groups: Mapping[str, QuotaSpec] = field(default_factory=dict)
    default: QuotaSpec | None = None
    #: The idle-GPU reclaim policies (``reclaim:``; absent: the defaults, reclaim on).
    reclaim: PolicySet = field(default_factory=PolicySet)
    #: The ``reclaim:`` section as written (validated), for the admin API to show and for
    #: re-validating against the offers of the day.
    reclaim_section: Mapping[str, Any] | None = None
    #: The clusters the pool spans (``clusters:``; absent: the one cluster ``default``). An
    #: agent reporting another cluster is refused with this list.
    clusters: tuple[str, ...] = (DEFAULT_CLUSTER,)
    #: Chargeback prices per GPU model (``prices:``; absent: nothing is priced).
    prices: Prices = field(default_factory=Prices)
    #: Workload classes (``classes:``; absent: interactive, training and inference with their
    #: defaults, ``pool.workloads.DEFAULT_CLASSES``).
    classes: Mapping[str, WorkloadClass] = field(default_factory=lambda: dict(DEFAULT_CLASSES))
    #: GPUs kept free of borrowing by preemptible classes (``borrowing: {keep_free}``; absent:
    #: none, ``pool.headroom``); the classes it is kept from are added where it is used
    #: (``headroom.headroom_for``).
    borrowing: Headroom = field(default_factory=Headroom)


_TOP = {
    "nodes",
    "offers",
    "quotas",
    "reclaim",
    "simulation",
    "clusters",
    "prices",
    "classes",
    "borrowing",
}
_NODE = {"name", "cluster", "cpu_milli", "memory_mib", "gpus", "labels", "cordoned"}
_GPU = {"model", "count", "uuid", "mig", "sharing", "memory_mib", "load"}
_MIG = {"enabled", "dynamic", "instances"}


def _where(path: str, err: PoolError) -> ConfigError:
    field = f"{path}.{err.field}" if err.field and not err.field.startswith(path) else path
    text = err.message
    if err.field and text.startswith(err.field + ": "):
        text = text[len(err.field) + 2 :]
    if err.allowed is not None and "(allowed:" in text:
        text = text[: text.rfind(" (allowed:")]
    return ConfigError(text, field=field, allowed=err.allowed, code=err.code)


def _keys(raw: object, allowed: set[str], path: str) -> Mapping[str, Any]:
    if not isinstance(raw, Mapping):
        raise ConfigError(f"must be a mapping, got {type(raw).__name__}", field=path)
    unknown = set(raw) - allowed
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(map(str, unknown)))}",
            field=path,
            allowed=sorted(allowed),
        )
    return raw


def _int(
    raw: Mapping[str, Any], key: str, path: str, default: int = 0, maximum: int = MAX_INT
) -> int:
    value = raw.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= maximum:
        raise ConfigError(
            f"must be a whole number from 0 to {maximum:,}, got {shown(value)}",
            field=f"{path}.{key}",
        )
    return value


def _short(raw: object, field: str, limit: int) -> str:
    """A uuid, a profile or a label: text of 1 to ``limit`` characters, no control character."""
    if not isinstance(raw, str) or not 0 < len(raw) <= limit:
        raise ConfigError(f"must be 1 to {limit} characters, got {shown(raw)}", field=field)
    bad = bad_character(raw.replace("/", ""))
    if bad is not None:
        raise ConfigError(f"may not hold a {bad}", field=field)
    return raw


def _labels(raw: object, field: str) -> dict[str, str]:
    """A node's labels: at most ``MAX_LABELS``, keys and values as the agent's report takes
    them (1 to 255 characters; '/' allowed, as in ``nvidia.com/gpu.product``)."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ConfigError("must be a mapping of label → value", field=field)
    check_count(len(raw), field, MAX_LABELS, "labels on a node")
    out = {}
    for key, value in raw.items():
        out[_short(key, f"{field}.{shown(key)}", MAX_NAME)] = _short(
            str(value) if isinstance(value, (int, float)) else value,
            f"{field}.{shown(key)}",
            MAX_NAME,
        )
    return out


def gpu_uuid(node: str, index: int) -> str:
    """A stable GPU UUID for GPUs declared without one (same name, same UUID, every start)."""
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_URL, f"jupyterhub-gpupool:{node}:{index}"))


#: Why ``sharing: auto`` is refused for a pool on Kubernetes (``kubernetes=True``).
KUBERNETES_AUTO_SHARING = (
    "{field}: sharing 'auto' cannot work on Kubernetes: whether a GPU is shared is the node's "
    "own setting there, made before any request comes (the device plugin's time-slicing "
    "config, chosen by the node label nvidia.com/device-plugin.config; with DRA, the GPU's "
    "shared claim); set {field} to 'exclusive' (whole GPUs) or 'shared' (fractions) to match "
    "the node"
)


def parse_nodes(
    raw: object, catalog: Catalog, path: str = "nodes", *, kubernetes: bool = False
) -> list[Node]:
    """Validate the ``nodes`` list (``kubernetes``: a non-MIG GPU must say whether it is
    shared, see ``KUBERNETES_AUTO_SHARING``)."""
    if not isinstance(raw, list):
        raise ConfigError("must be a list of nodes", field=path)
    check_count(len(raw), path, MAX_NODES, "nodes")
    nodes, seen = [], set()
    total = 0
    for n, node_raw in enumerate(raw):
        where = f"{path}[{n}]"
        node_raw = _keys(node_raw, _NODE, where)
        name = check_name(node_raw.get("name"), f"{where}.name", "a node's name")
        if name in seen:
            raise ConfigError(f"node {name!r} is declared twice", field=f"{where}.name")
        seen.add(name)
        gpus: list[Gpu] = []
        gpu_list = node_raw.get("gpus", [])
        if not isinstance(gpu_list, list):
            raise ConfigError("must be a list", field=f"{where}.gpus")
        for g, gpu_raw in enumerate(gpu_list):
            gwhere = f"{where}.gpus[{g}]"
            gpu_raw = _keys(gpu_raw, _GPU, gwhere)
            try:
                model = catalog.model(str(gpu_raw.get("model", "")))
            except PoolError as e:
                raise _where(gwhere, e) from None
            count = _int(gpu_raw, "count", gwhere, 1, maximum=MAX_GPUS_PER_NODE)
            if count < 1:
                raise ConfigError("must be at least 1", field=f"{gwhere}.count")
            check_count(len(gpus) + count, f"{gwhere}.count", MAX_GPUS_PER_NODE, "GPUs per node")
            total += count
            check_count(total, f"{gwhere}.count", MAX_GPUS, "GPUs in the pool")
            if "uuid" in gpu_raw:
                _short(gpu_raw["uuid"], f"{gwhere}.uuid", 64)
            if "uuid" in gpu_raw and count != 1:
                raise ConfigError("a uuid names one GPU; drop it or count", field=f"{gwhere}.uuid")
            sharing = gpu_raw.get("sharing", "auto")
            if sharing not in SHARING_MODES:
                raise ConfigError(
                    f"unknown sharing {sharing!r}", field=f"{gwhere}.sharing", allowed=SHARING_MODES
                )
            mig = _keys(gpu_raw.get("mig", {}), _MIG, f"{gwhere}.mig")
            enabled = bool(mig.get("enabled", False))
            if kubernetes and sharing == "auto" and not enabled:
                raise ConfigError(
                    KUBERNETES_AUTO_SHARING.format(field=f"{gwhere}.sharing"),
                    field=f"{gwhere}.sharing",
                    allowed=["exclusive", "shared"],
                )
            if enabled and not model.mig_capable:
                raise ConfigError(f"{model.name} does not support MIG", field=f"{gwhere}.mig")
            instances: list[MigInstance] = []
            for i, inst in enumerate(mig.get("instances", []) or []):
                iwhere = f"{gwhere}.mig.instances[{i}]"
                inst = _keys(inst, {"profile", "start", "uuid"}, iwhere)
                if "start" not in inst:
                    raise ConfigError("needs a start (memory slice)", field=f"{iwhere}.start")
                if len(instances) >= 16:
                    raise ConfigError("at most 16 MIG instances on a GPU", field=iwhere)
                instances.append(
                    MigInstance(
                        _short(inst.get("profile"), f"{iwhere}.profile", 32),
                        _int(inst, "start", iwhere, maximum=64),
                        None if inst.get("uuid") is None else _short(inst["uuid"], iwhere, 64),
                    )
                )
            if instances and not enabled:
                raise ConfigError("instances need mig.enabled: true", field=f"{gwhere}.mig")
            try:
                if enabled:
                    validate_mig_layout(model, [(i.profile, i.start) for i in instances])
            except PoolError as e:
                raise _where(f"{gwhere}.mig.instances", e) from None
            for _ in range(count):
                index = len(gpus)
                gpus.append(
                    Gpu(
                        str(gpu_raw.get("uuid") or gpu_uuid(name, index)),
                        index,
                        model,
                        name,
                        enabled,
                        bool(mig.get("dynamic", False)),
                        sharing,
                        instances=[MigInstance(i.profile, i.start, i.uuid) for i in instances],
                    )
                )
        nodes.append(
            Node(
                name,
                str(node_raw.get("cluster", "default")),
                _int(node_raw, "cpu_milli", where),
                _int(node_raw, "memory_mib", where),
                gpus,
                bool(node_raw.get("cordoned", False)),
                labels=_labels(node_raw.get("labels"), f"{where}.labels"),
            )
        )
    return nodes


def parse_pool_config(raw: object, catalog: Catalog, *, kubernetes: bool = False) -> PoolConfig:
    """Validate a whole pool config mapping (``kubernetes``: as ``parse_nodes``)."""
    raw = _keys(raw if raw is not None else {}, _TOP, "pool config")
    clusters = parse_clusters(raw.get("clusters"))
    nodes = parse_nodes(raw.get("nodes", []), catalog, kubernetes=kubernetes)
    for n, node in enumerate(nodes):
        check_cluster_name(node.cluster, f"nodes[{n}].cluster")
        check_known(node.cluster, clusters, f"nodes[{n}].cluster")
    offers_raw = raw.get("offers", [])
    if not isinstance(offers_raw, list):
        raise ConfigError("must be a list of offers", field="offers")
    check_count(len(offers_raw), "offers", MAX_OFFERS, "offers")
    offers, names = [], set()
    for i, offer_raw in enumerate(offers_raw):
        try:
            offer = parse_offer(offer_raw, catalog)
        except PoolError as e:
            raise _where(f"offers[{i}]", e) from None
        if offer.name in names:
            raise ConfigError(f"offer {offer.name!r} is declared twice", field=f"offers[{i}].name")
        for c in offer.clusters:
            check_known(c, clusters, f"offers[{i}].clusters")
        names.add(offer.name)
        offers.append(offer)
    quotas = _keys(raw.get("quotas", {}) or {}, {"default", "users", "groups"}, "quotas")
    default = (
        QuotaSpec.parse(quotas["default"], "quotas.default")
        if quotas.get("default") is not None
        else None
    )
    users: dict[str, QuotaSpec] = {}
    groups: dict[str, QuotaSpec] = {}
    for kind, target in (("users", users), ("groups", groups)):
        section = quotas.get(kind, {}) or {}
        if not isinstance(section, Mapping):
            raise ConfigError("must be a mapping of name → quota", field=f"quotas.{kind}")
        check_count(len(users) + len(section), f"quotas.{kind}", MAX_QUOTAS, "quotas")
        for name, spec in section.items():
            where = f"quotas.{kind}.{shown(name)}"
            name = check_name(str(name), where, f"a {kind[:-1]}'s name")
            target[name] = QuotaSpec.parse(spec, f"quotas.{kind}.{name}")
    section = raw.get("reclaim")
    reclaim = parse_policies(section, {o.name: o for o in offers}, "reclaim", catalog)
    return PoolConfig(
        tuple(nodes),
        tuple(offers),
        users,
        groups,
        default,
        reclaim,
        dict(section) if section else None,
        clusters,
        parse_prices(raw.get("prices"), catalog.names),
        parse_classes(raw.get("classes")),
        parse_borrowing(raw.get("borrowing"), catalog.names),
    )


def load_pool_config(path: str | Path, catalog: Catalog, *, kubernetes: bool = False) -> PoolConfig:
    """Read and validate a pool config file; errors say which file and which field."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML ({e})", field="pool config") from None
    except OSError as e:
        raise ConfigError(f"cannot read {path}: {e.strerror}", field="pool config") from None
    try:
        return parse_pool_config(raw, catalog, kubernetes=kubernetes)
    except ConfigError as e:
        err = ConfigError(f"{path}: {e.message}", code=e.code)
        err.field, err.allowed = e.field, e.allowed
        raise err from None

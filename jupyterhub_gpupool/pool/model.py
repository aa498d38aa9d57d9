"""Inventory and requests as plain values: clusters → nodes → GPUs → MIG instances, and offers.

The allocator keeps these in memory; the store (service) rebuilds them from rows. Mutation is
limited to occupancy (who holds which piece), done through the allocator only.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

from .catalog import Catalog, GpuModel
from .errors import ConfigError, RequestError, UnknownModel
from .limits import (
    MAX_GPUS_PER_NODE,
    MAX_GROUPS_PER_OFFER,
    MAX_INT,
    MAX_MEMORY_GB,
    check_count,
    check_name,
    check_text,
    shown,
)
from .miglayout import validate_mig_layout

#: Offer kinds (contract): a whole GPU (or several on one node), a MIG slice, a share of a GPU,
#: or no GPU at all (a CPU-only server the picker may show).
OFFER_KINDS = ("gpu", "mig", "shared", "cpu")

#: How a non-MIG GPU may be used: whole or shared as requests come ("auto"), whole only, or
#: shared only. A MIG-enabled GPU only ever serves MIG offers.
SHARING_MODES = ("auto", "exclusive", "shared")

MILLI = 1000  # a whole GPU, in the milli-GPU units shared fractions are counted in

#: A GPU's state as placement sees it (:meth:`Gpu.state_key`), a tagged tuple read by position:
#: ``("x",)`` unschedulable, ``("n", model, sharing, free_milli)`` a plain GPU,
#: ``("m", model, dynamic_mig, ((profile, start, held), ...))`` a MIG GPU. Kept a plain tuple
#: (not a class) because it keys the hot placement caches; hence ``Any`` for its items.
StateKey = tuple[Any, ...]
#: A node's GPU states in GPU order (:meth:`Node.signature`).
Signature = tuple[StateKey, ...]

#: Holder of a MIG instance the pool no longer wants but the node still has (dynamic MIG): it
#: stays occupied, so nothing is planned over it, until the node reports it destroyed.
RETIRING = "~retiring"

#: Queue priority of the named priority classes; an offer may also give a number instead.
PRIORITY_CLASSES = {"low": -10, "default": 0, "high": 10}
#: An offer's ``approval``: ``required`` puts every request before an administrator first.
APPROVALS = ("none", "required")


@dataclass
class MigInstance:
    """A GPU instance that exists (static MIG) or is planned (dynamic MIG) on one GPU.

    ``processes`` is the node's last count of compute processes on it (None: unknown), as an
    inventory reports it; the pool never plans to destroy an instance with processes.
    """

    profile: str
    start: int
    uuid: str | None = None
    lease: str | None = None
    processes: int | None = None


@dataclass
class Gpu:
    """One physical GPU and who holds which part of it."""

    uuid: str
    index: int
    model: GpuModel
    node: str = ""
    mig_enabled: bool = False
    dynamic_mig: bool = False
    sharing: str = "auto"
    healthy: bool = True
    cordoned: bool = False
    instances: list[MigInstance] = field(default_factory=list)
    whole_lease: str | None = None
    shares: dict[str, int] = field(default_factory=dict)
    #: A pod the pool did not place holds it (``pool.outside``): it takes nothing new.
    outside: bool = False
    #: Who holds it or its MIG instances outside the pool, where the cluster names the device
    #: (a DRA claim, ``pool.outside.mark_exact``); shown on the pool map.
    outside_by: tuple[str, ...] = ()
    #: Its MIG instances are made per claim by NVIDIA's DRA driver (its DynamicMIG feature):
    #: a planned instance needs neither the agent nor mig-manager (``pool.dramig``).
    mig_by_claim: bool = False

    @property
    def schedulable(self) -> bool:
        """Healthy, not cordoned and not held outside the pool: may take new work."""
        return self.healthy and not self.cordoned and not self.outside

    @property
    def used_milli(self) -> int:
        """Milli-GPUs held on a non-MIG GPU."""
        return MILLI if self.whole_lease else sum(self.shares.values())

    @property
    def free_milli(self) -> int:
        """Milli-GPUs still free on a non-MIG GPU (0 when unschedulable)."""
        if self.mig_enabled or not self.schedulable:
            return 0
        return MILLI - self.used_milli

    @property
    def is_idle(self) -> bool:
        """Nothing on it is held."""
        return (
            not self.whole_lease
            and not self.shares
            and all(i.lease is None for i in self.instances)
        )

    def free_units(self) -> float:
        """Free capacity in the units quotas charge: free milli for plain GPUs; for MIG, one
        GPU less the dominant shares of the held instances (a held 1g.10gb of an A100 takes
        1/7, as its lease is charged). Placement scores fragmentation on memory slices instead
        (``placement.key_free``); this is the view users and reports read."""
        if not self.schedulable:
            return 0.0
        if not self.mig_enabled:
            return self.free_milli / MILLI
        held = sum(
            (self.model.profile_units(i.profile) for i in self.instances if i.lease is not None),
            Fraction(0),
        )
        return float(max(Fraction(0), 1 - held))

    def state_key(self) -> StateKey:
        """Everything placement depends on, hashable: equal keys place and score alike."""
        if not self.schedulable:
            return ("x",)
        if self.mig_enabled:
            inst = tuple(sorted((i.profile, i.start, i.lease is not None) for i in self.instances))
            return ("m", self.model, self.dynamic_mig, inst)
        return ("n", self.model, self.sharing, self.free_milli)


@dataclass
class Node:
    """A machine with GPUs; CPU and memory are checked for every request placed on it."""

    name: str
    cluster: str = "default"
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: list[Gpu] = field(default_factory=list)
    cordoned: bool = False
    draining: bool = False
    labels: Mapping[str, str] = field(default_factory=dict)
    cpu_used: int = 0
    memory_used: int = 0
    #: Its agent went silent (the node may be down): it keeps its leases, takes nothing new.
    unreachable: bool = False

    @property
    def schedulable(self) -> bool:
        """Cordoned, draining and unreachable nodes take nothing new."""
        return not (self.cordoned or self.draining or self.unreachable)

    def fits_resources(self, cpu_milli: int, memory_mib: int) -> bool:
        """CPU and memory room for one more request (0 capacity means "not tracked")."""
        cpu_ok = not self.cpu_milli or self.cpu_used + cpu_milli <= self.cpu_milli
        mem_ok = not self.memory_mib or self.memory_used + memory_mib <= self.memory_mib
        return cpu_ok and mem_ok

    def signature(self) -> Signature:
        """The GPU side of the node's state; nodes with equal signatures score alike."""
        return tuple(g.state_key() for g in self.gpus)


def validate_node(node: Node) -> None:
    """A node's GPUs must be consistent on their own: unique uuids, MIG instances only on
    MIG-enabled GPUs of MIG-capable models, in a layout NVIDIA allows."""
    seen: set[str] = set()
    for gpu in node.gpus:
        if gpu.uuid in seen:
            raise ConfigError(f"GPU {gpu.uuid} appears twice on node {node.name}", field="uuid")
        seen.add(gpu.uuid)
        if gpu.instances and not gpu.mig_enabled:
            raise ConfigError(f"GPU {gpu.uuid} has MIG instances but MIG is off", field="mig")
        if gpu.mig_enabled:
            if not gpu.model.mig_capable:
                raise ConfigError(
                    f"GPU {gpu.uuid}: {gpu.model.name} does not support MIG", field="mig"
                )
            validate_mig_layout(gpu.model, [(i.profile, i.start) for i in gpu.instances])


@dataclass(frozen=True)
class Offer:
    """What a user can ask for (a contract users and scripts rely on), declared by the admin."""

    name: str
    kind: str
    display_name: str = ""
    description: str = ""
    count: int = 1
    profile: str | None = None
    models: tuple[str, ...] = ()
    fraction: float | None = None
    min_memory_gb: float | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    groups: tuple[str, ...] = ()
    priority_class: str = "default"
    #: Clusters whose nodes may serve it (empty: every cluster of the pool).
    clusters: tuple[str, ...] = ()
    #: ``required``: every request waits for an administrator's approval first.
    approval: str = "none"
    #: With DRA, a server's claim may fall back to another free device of the offer on the
    #: granted node when the granted one is taken first (``firstAvailable``; ``pool.fallback``).
    fallback: bool = False

    @property
    def milli(self) -> int:
        """Per-GPU share in milli-GPUs (a whole GPU is 1000)."""
        if self.kind == "shared":
            return round((self.fraction or 0) * MILLI)
        return MILLI if self.kind == "gpu" else 0

    @property
    def priority(self) -> int:
        """Queue priority of a request for this offer: ``priority_class`` as a number if it is
        one, else the named class's value (an unknown name counts as default)."""
        try:
            return int(self.priority_class)
        except ValueError:
            return PRIORITY_CLASSES.get(self.priority_class, 0)

    def allows_model(self, model: str) -> bool:
        """An empty model list means any model."""
        return not self.models or model in self.models

    def visible_to(self, groups: Iterable[str]) -> bool:
        """An offer without groups is for everybody."""
        return not self.groups or bool(set(self.groups) & set(groups))

    def served_in(self, clusters: Iterable[str]) -> frozenset[str] | None:
        """The clusters a grant of this offer may go to for a hub launching into ``clusters``
        (empty: anywhere). ``None``: anywhere at all; an empty set: nowhere."""
        wanted = frozenset(clusters)
        if not self.clusters:
            return wanted or None
        mine = frozenset(self.clusters)
        return mine & wanted if wanted else mine


def offer_priority(offer: Offer | None) -> int:
    """``offer.priority``, or 0 for a request whose offer is gone from the configuration."""
    return 0 if offer is None else offer.priority


_OFFER_FIELDS = {f for f in Offer.__dataclass_fields__}
#: Offer keys of early configs that belong to the ``reclaim:`` section (key there).
_RECLAIM_FIELDS = {"idle_timeout": "idle_timeout", "reclaim_policy": "action"}


def _number(
    raw: Mapping[str, object],
    key: str,
    kind: type,
    *,
    minimum: float | None = None,
    maximum: float | None = None,
) -> object:
    value = raw[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"must be a number, got {shown(value)}", field=key)
    if kind is int and int(value) != value:
        raise ConfigError(f"must be a whole number, got {shown(value)}", field=key)
    if minimum is not None and value < minimum:
        raise ConfigError(f"must be at least {minimum}, got {shown(value)}", field=key)
    if maximum is not None and value > maximum:
        raise ConfigError(f"must be at most {maximum:,}, got {shown(value)}", field=key)
    return kind(value)


def parse_offer(raw: Mapping[str, object], catalog: Catalog) -> Offer:
    """Validate an admin's offer declaration against the catalog; errors name the field."""
    if not isinstance(raw, Mapping):
        raise ConfigError("an offer must be a mapping", field="offer")
    for key, target in _RECLAIM_FIELDS.items():
        if key in raw:  # accepted once and never read: say where it takes effect instead
            raise ConfigError(
                f"offer {raw.get('name')!r}: {key} is a reclaim policy setting: set "
                f"reclaim.offers.{raw.get('name')}.{target} in the pool config",
                field=key,
            )
    unknown = set(raw) - _OFFER_FIELDS
    if unknown:
        raise ConfigError(
            f"unknown field(s) {', '.join(sorted(unknown))}",
            field="offer",
            allowed=sorted(_OFFER_FIELDS),
        )
    name = check_name(raw.get("name"), "name", "an offer's name")
    for key in ("display_name", "description"):
        if key in raw:
            check_text(raw[key], key)
    if "priority_class" in raw:
        pclass = raw["priority_class"]
        if isinstance(pclass, bool) or not isinstance(pclass, (str, int)):
            raise ConfigError("must be a class name or a number", field="priority_class")
        if isinstance(pclass, int) and not -MAX_INT - 1 <= pclass <= MAX_INT:
            raise ConfigError(f"must be from {-MAX_INT - 1} to {MAX_INT}", field="priority_class")
        if isinstance(pclass, str):
            check_name(pclass, "priority_class", "a priority class")
    kind = raw.get("kind")
    if kind not in OFFER_KINDS:
        raise ConfigError(
            f"offer {name!r}: unknown kind {kind!r}", field="kind", allowed=OFFER_KINDS
        )
    models = raw.get("models", [])
    if not isinstance(models, (list, tuple)) or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"offer {name!r}: models must be a list of names", field="models")
    resolved: list[str] = []
    for m in models:
        try:
            found = catalog.model(m).name
        except UnknownModel as e:
            raise UnknownModel(
                f"offer {name!r}: unknown GPU model {m!r}", field="models", allowed=e.allowed
            ) from None
        if found not in resolved:
            resolved.append(found)
    values: dict[str, object] = dict(raw)
    values["models"] = tuple(resolved)
    if "groups" in raw:
        groups = raw["groups"]
        if not isinstance(groups, (list, tuple)) or not all(isinstance(g, str) for g in groups):
            raise ConfigError(f"offer {name!r}: must be a list of group names", field="groups")
        check_count(len(groups), "groups", MAX_GROUPS_PER_OFFER, "groups on an offer")
        for g, group in enumerate(groups):
            check_name(group, f"groups[{g}]", "a group's name")
        values["groups"] = tuple(groups)
    if "clusters" in raw:
        clusters = raw["clusters"]
        if not isinstance(clusters, (list, tuple)) or not all(isinstance(c, str) for c in clusters):
            raise ConfigError(f"offer {name!r}: must be a list of cluster names", field="clusters")
        values["clusters"] = tuple(dict.fromkeys(clusters))
    if raw.get("approval", "none") not in APPROVALS:
        raise ConfigError(
            f"offer {name!r}: unknown approval {raw['approval']!r}",
            field="approval",
            allowed=APPROVALS,
        )
    for key, typ, low, high in (
        ("count", int, 1, MAX_GPUS_PER_NODE),
        ("cpu_milli", int, 0, MAX_INT),
        ("memory_mib", int, 0, MAX_INT),
    ):
        if key in raw:
            values[key] = _number(raw, key, typ, minimum=low, maximum=high)
    if kind == "mig":
        profile = raw.get("profile")
        if not isinstance(profile, str):
            raise ConfigError(f"offer {name!r}: a mig offer needs a profile", field="profile")
        if not resolved:
            raise ConfigError(
                f"offer {name!r}: a mig offer must name its GPU models (profiles differ per model)",
                field="models",
                allowed=[m.name for m in catalog if m.mig_capable],
            )
        for m in resolved:
            if not catalog.model(m).mig_capable:
                raise ConfigError(
                    f"offer {name!r}: {m} has no MIG",
                    field="models",
                    allowed=[x.name for x in catalog if x.mig_capable],
                )
            catalog.model(m).profile(profile)  # raises UnknownProfile naming the allowed ones
        if values.get("count", 1) != 1:
            raise ConfigError(
                f"offer {name!r}: a mig offer is one slice", field="count", allowed=[1]
            )
    elif "profile" in raw:
        raise ConfigError(f"offer {name!r}: only mig offers take a profile", field="profile")
    if kind == "shared":
        if "fraction" not in raw:
            raise ConfigError(f"offer {name!r}: a shared offer needs a fraction", field="fraction")
        fraction = _number(raw, "fraction", float)
        if not 0.001 <= fraction < 1:  # type: ignore[operator]  # _number(float) gave a float
            raise ConfigError(
                f"offer {name!r}: fraction must be at least 0.001 (one milli-GPU) and below 1",
                field="fraction",
            )
        values["fraction"] = fraction
        if values.get("count", 1) != 1:
            raise ConfigError(
                f"offer {name!r}: a shared offer is one share of one GPU",
                field="count",
                allowed=[1],
            )
    elif "fraction" in raw:
        raise ConfigError(f"offer {name!r}: only shared offers take a fraction", field="fraction")
    if "fallback" in raw:
        if not isinstance(raw["fallback"], bool):
            raise ConfigError(f"offer {name!r}: fallback must be true or false", field="fallback")
        if raw["fallback"] and kind not in ("gpu", "mig"):
            raise ConfigError(
                f"offer {name!r}: only gpu and mig offers fall back (a share uses its GPU's "
                "shared claim)",
                field="fallback",
            )
    if "min_memory_gb" in raw:
        values["min_memory_gb"] = _number(
            raw, "min_memory_gb", float, minimum=0, maximum=MAX_MEMORY_GB
        )
    values.setdefault("display_name", name)
    return Offer(**values)  # type: ignore[arg-type]  # each value checked by its field above


def offer_units(offer: Offer, model: GpuModel) -> Fraction:
    """GPU units one grant of ``offer`` on ``model`` costs: a whole GPU is 1 (times the
    model's weight), a MIG slice its dominant share of its GPU, a share its fraction."""
    if offer.kind == "mig":
        return model.profile_units(offer.profile or "")
    if offer.kind == "shared":
        return Fraction(offer.milli, MILLI)
    if offer.kind == "gpu":
        return offer.count * _weight_units(model.unit_weight)
    return Fraction(0)


@functools.cache
def _weight_units(unit_weight: float) -> Fraction:
    """A whole GPU's units at ``unit_weight`` (a model's), as a fraction; the catalog has a
    few weights and every grant asks, so each is worked out once."""
    return Fraction(unit_weight).limit_denominator(1000)


@dataclass(frozen=True)
class Request:
    """A user's ask for one offer for one named server."""

    id: str
    user: str
    offer: str
    server: str = ""
    group: str | None = None
    groups: tuple[str, ...] = ()
    priority: int = 0
    arrival: float = 0.0
    #: Clusters the asking hub can launch into (empty: any cluster).
    clusters: tuple[str, ...] = ()
    #: An approved exception: held to the quotas' exception ceilings, not their limits.
    exception: bool = False
    #: Copies of the offer in one grant (an inference job's replicas, ``workloads.replicas_of``).
    replicas: int = 1
    #: The workload class of a job's or kernel's request (None: a server's, ``interactive``);
    #: the allocator reads it for the headroom (``pool.headroom``).
    workload: str | None = None

    def __post_init__(self) -> None:
        if not self.user:
            raise RequestError("a request needs a user", field="user")
        if not self.offer:
            raise RequestError("a request needs an offer", field="offer")

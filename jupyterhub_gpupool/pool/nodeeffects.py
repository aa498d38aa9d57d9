"""The effects on nodes, inventory, MIG and the pool config (``pool.effects``): a node's
reachability and drain, outside marks, re-partitions and MIG results, an inventory, and a
config load's offers, quotas, prices and nodes (the rows are ``store/nodeapply.py``'s and
``store/configapply.py``'s)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .headroom import Headroom
from .model import MigInstance, Node, Offer
from .outside import OutsideHolds, Rebinding
from .pricing import Prices
from .quota import QuotaSpec


@dataclass(frozen=True)
class NodeReachable:
    """A node's agent went silent (``reachable`` False: it takes nothing new, its leases
    stay) or reports again (True: it takes grants again)."""

    node: str
    reachable: bool


@dataclass(frozen=True)
class DrainDeadline:
    """A drain by a deadline was given (epoch seconds): ``noticed`` leases got its notice."""

    node: str
    deadline: float
    noticed: int


@dataclass(frozen=True)
class OutsideSet:
    """Pods the pool did not place hold these devices of ``node`` (``holds``: the marks
    after; they take nothing new)."""

    node: str
    holds: OutsideHolds


@dataclass(frozen=True)
class Rebound:
    """A lease's server runs on ``devices``: the lease, and the leases it swaps with
    (``rebinding.others``; ``before``: their slot keys before), hold what their pods really
    got; the node's outside marks follow (``rebinding.outside``)."""

    lease_id: str
    node: str
    devices: tuple[str, ...]
    rebinding: Rebinding
    before: tuple[tuple[str, tuple[str, ...]], ...]


@dataclass(frozen=True)
class GpuCordoned:
    """A GPU is cordoned (a re-partition waits on it) or given back its cordon."""

    gpu: str
    cordoned: bool


@dataclass(frozen=True)
class RepartitionOpened:
    """An administrator asks for a GPU's MIG ``layout`` (its row is written now; ``plan``:
    the plan as the API answers it); ``was_cordoned``: the GPU's cordon before."""

    node: str
    gpu: str
    layout: tuple[tuple[str, int], ...]
    method: str
    was_cordoned: bool
    plan: Mapping[str, object]


@dataclass(frozen=True)
class RepartitionApplying:
    """Nothing is in the way of re-partition ``rep`` (0: the one opened by this command) of
    ``gpu`` any more: it runs. ``instances``: the GPU's instances for the allocator once its
    layout is written (the agent's way; None: the node's label, the layout comes with its
    inventory)."""

    rep: int
    gpu: str
    layout: tuple[tuple[str, int], ...]
    instances: tuple[MigInstance, ...] | None


@dataclass(frozen=True)
class RepartitionClosed:
    """Re-partition ``rep`` ends (``done``, ``failed`` with ``error``, ``cancelled``); its
    GPU gets back the cordon it had (``cordoned``; None: the GPU is gone)."""

    rep: int
    gpu: str
    state: str
    error: str | None
    cordoned: bool | None


@dataclass(frozen=True)
class MigCreated:
    """A node made a wanted MIG instance (``uuid``): its lease (if any) is ready, and a grant
    not yet bound (``renew``) gets its full grant time again, counted from now."""

    node: str
    gpu: str
    profile: str
    start: int
    uuid: str | None
    lease_id: str | None
    renew: bool


@dataclass(frozen=True)
class MigFailed:
    """A node's MIG action (``op``: create, destroy) failed, or the pool gives up on a creation
    a busy instance blocks (``system``): audited (``mig-failed``; ``attempt``: the failures so
    far), and told to the lease (``message``; None: left as it is)."""

    node: str
    gpu: str
    op: str
    profile: str
    start: int
    error: str | None
    attempt: int | None = None
    lease_id: str | None = None
    message: str | None = None
    system: bool = False


@dataclass(frozen=True)
class MigDestroyed:
    """A node destroyed an instance the pool no longer wants (or found it gone)."""

    node: str
    gpu: str
    profile: str
    start: int
    error: str | None


@dataclass(frozen=True)
class MigRowsSet:
    """A GPU's instance rows ((profile, start, uuid, failed creations, the last error)) and
    what its node reported (``observed``) after its results; ``instances``: the GPU's
    instances for the allocator (what a rebuild from those rows would give it)."""

    gpu: str
    rows: tuple[tuple[str, int, str | None, int, str | None], ...]
    observed: tuple[Mapping[str, Any], ...] | None
    instances: tuple[MigInstance, ...]


@dataclass(frozen=True)
class LeaseNoted:
    """What the user is told of a lease changes (its ``message``)."""

    lease_id: str
    message: str


@dataclass(frozen=True)
class NodeReported:
    """An agent's inventory of a node is written: its row (added or updated), its GPUs' rows
    (``node.gpus``, in order; a GPU the node no longer has goes) with, for each, its MIG
    instance rows ((profile, start, uuid, failed creations, the last error)) and what the
    node reported (``observed``). The allocator puts ``node`` (what a rebuild from those rows
    gives) in place of its own (``pool.nodeput.put_node``, ``outside``: the node's marks).
    The leases it loses come before it as their own ``LeaseReleased``."""

    node: Node
    rows: tuple[tuple[tuple[str, int, str | None, int, str | None], ...], ...]
    observed: tuple[tuple[Mapping[str, Any], ...] | None, ...]
    outside: OutsideHolds


@dataclass(frozen=True)
class InventoryTaken:
    """A node's inventory is audited (``inventory``, by ``actor``: how many GPUs)."""

    node: str
    gpus: int
    actor: str


# -- the pool config (``LoadConfig``): rows written, the allocator changed in place


@dataclass(frozen=True)
class OfferLoaded:
    """The file's offer ``offer`` is written at ``position`` (a new row, or the file's own row
    updated) and put in the allocator's table (``pool.offertable.put_offer``)."""

    offer: Offer
    position: int


@dataclass(frozen=True)
class OfferDropped:
    """The file's offer row ``name`` goes, and the allocator's offer (its requests end after)."""

    name: str


@dataclass(frozen=True)
class OffersOrdered:
    """The allocator's offer table in its rows' order, the demand re-weighed over it."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class HeadroomSet:
    """The config's headroom (``pool.headroom``; None: none) is the allocator's."""

    headroom: Headroom | None


@dataclass(frozen=True)
class FileQuotaLoaded:
    """The file's quota of a user, a group or the default (``kind``, ``name``) is written
    (``spec``), or dropped (``None``), in the rows and the allocator's quota book."""

    kind: str
    name: str
    spec: QuotaSpec | None


@dataclass(frozen=True)
class PricesLoaded:
    """The config's prices are recorded over time (the store reconciles them with the
    recorded schedules, ``pool.pricing.reconcile``: a past hour is never repriced)."""

    prices: Prices


@dataclass(frozen=True)
class NodeDeclared:
    """A declared node's rows are written as ``NodeReported``'s (what the node reported
    stays), and ``node`` put in place of the allocator's (``pool.nodeput.put_node``)."""

    node: Node
    rows: tuple[tuple[tuple[str, int, str | None, int, str | None], ...], ...]
    outside: OutsideHolds


@dataclass(frozen=True)
class ConfigLoaded:
    """The load is audited (``config-loaded``, how many offers and nodes)."""

    offers: int
    nodes: int

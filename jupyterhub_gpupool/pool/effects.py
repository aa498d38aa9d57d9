"""What a decision does, as plain values: the effects ``pool.decide`` returns.

``decide`` only says what is to happen; the store's one applier (``store/apply.py``) makes each
effect true, in order, in one transaction: in the rows (and the audit log) and, through
``apply_effect`` below, in the allocator, the in-memory pool state this package owns. Applied
in order, the effects leave the allocator exactly as the decision saw it would be.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from fractions import Fraction
from typing import Any

from .allocator import Allocator
from .approval import Ask
from .decisions import Grant, Queued
from .model import MigInstance, Request
from .outside import OutsideHolds, Rebinding
from .quota import QuotaSpec
from .reclaim import ReclaimState


@dataclass(frozen=True)
class NewLease:
    """Facts of a request asked now that its new row keeps (the allocator has no use for them)."""

    hub: str | None = None  # the hub asking (None: the pool's own)
    resize_of: str | None = None  # the lease it will replace (a resize target)


@dataclass(frozen=True)
class LeaseGranted:
    """A request is granted: a new one (``new``: its row is written now) or a waiter's."""

    grant: Grant
    new: NewLease | None = None


@dataclass(frozen=True)
class LeaseQueued:
    """A request waits in the queue: a new one (``new``) or an approved one (its row exists)."""

    queued: Queued
    new: NewLease | None = None


@dataclass(frozen=True)
class AwaitingApproval:
    """A new request waits for an administrator; it holds nothing meanwhile."""

    request: Request
    ask: Ask
    reason: str
    duration: float | None
    new: NewLease


@dataclass(frozen=True)
class LeaseReleased:
    """A lease (or a queued request, or one awaiting approval) ends for ``reason``; ``was``:
    its state before."""

    lease_id: str
    reason: str
    was: str


@dataclass(frozen=True)
class BorrowedChanged:
    """A live lease becomes borrowed (``borrowed``) or within guarantee."""

    lease_id: str
    borrowed: bool


@dataclass(frozen=True)
class WaitReason:
    """Why a waiter still waits changed (``no_capacity``, ``quota``): kept in memory only,
    where the next decisions read it (a long ``no_capacity`` waiter holds capacity back)."""

    lease_id: str
    reason: str


@dataclass(frozen=True)
class QuotaSet:
    """A user's or group's (``kind``) quota is set by API."""

    kind: str
    name: str
    spec: QuotaSpec


@dataclass(frozen=True)
class QuotaReset:
    """A user's or group's API override is dropped: the file's quota (``spec``) applies, or
    none (``None``: a user gets the default)."""

    kind: str
    name: str
    spec: QuotaSpec | None


@dataclass(frozen=True)
class KeptAlive:
    """The lease's holder reported it runs (its last keepalive is now)."""

    lease_id: str


@dataclass(frozen=True)
class LeaseActivated:
    """A grant is bound (granted → active): it no longer expires."""

    lease_id: str


@dataclass(frozen=True)
class NoticeExtended:
    """The user's "keep my GPU" ends an idle notice (``state``: the lease's reclaim state
    after); the lease is active again until the reclaimer's next notice."""

    lease_id: str
    state: ReclaimState
    extensions: int
    limit: int
    until: float


@dataclass(frozen=True)
class NoticeWithdrawn:
    """An administrator withdraws a lease's notice (a cancel, an uncordon): ``state`` is its
    reclaim state after, ``kind`` and ``notice`` the withdrawn notice's, ``why`` the reason."""

    lease_id: str
    state: ReclaimState
    why: str
    kind: str
    notice: str


@dataclass(frozen=True)
class NoticeGiven:
    """An enforced notice (an administrator's, a drain's, a spent budget's, an approval's
    lapse) on a bound lease: ``state`` is its reclaim state after, its notice included."""

    lease_id: str
    state: ReclaimState


@dataclass(frozen=True)
class RequestDenied:
    """An administrator denies a request awaiting approval, with the reason the user sees (it
    ends as ``denied``: a ``LeaseReleased`` follows)."""

    lease_id: str
    reason: str


@dataclass(frozen=True)
class NodeFlagsSet:
    """A node is cordoned, uncordoned or drained (``action``): it keeps its leases; the flags
    None are left as they are."""

    node: str
    action: str
    cordoned: bool | None = None
    draining: bool | None = None


@dataclass(frozen=True)
class RequestApproved:
    """An administrator approves a request awaiting approval: for ``duration`` seconds (None:
    as long as it is held) and ``offer`` (the one asked, or a smaller one of its kind), which
    takes ``units``; a ``LeaseGranted`` or ``LeaseQueued`` of it follows."""

    lease_id: str
    duration: float | None
    offer: str
    note: str
    units: Fraction


@dataclass(frozen=True)
class SharingSet:
    """A node's device plugin advertises new sharing modes: (GPU uuid, mode) of each GPU
    whose mode changes; leases keep what they hold, new grants follow the modes."""

    node: str
    modes: tuple[tuple[str, str], ...]


# -- nodes and inventory


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


Effect = (
    LeaseGranted
    | LeaseQueued
    | AwaitingApproval
    | LeaseReleased
    | BorrowedChanged
    | WaitReason
    | QuotaSet
    | QuotaReset
    | KeptAlive
    | LeaseActivated
    | NoticeExtended
    | NoticeWithdrawn
    | NoticeGiven
    | RequestDenied
    | NodeFlagsSet
    | RequestApproved
    | SharingSet
    | NodeReachable
    | DrainDeadline
    | OutsideSet
    | Rebound
    | GpuCordoned
    | RepartitionOpened
    | RepartitionApplying
    | RepartitionClosed
    | MigCreated
    | MigFailed
    | MigDestroyed
    | MigRowsSet
    | LeaseNoted
)


def apply_effect(alloc: Allocator, effect: Effect, now: float) -> None:
    """Make ``effect`` true in the allocator (the applier's in-memory half; the effects on a
    lease's binding and notices change only rows)."""
    if isinstance(effect, (LeaseGranted, LeaseQueued)):
        alloc.apply(effect.grant if isinstance(effect, LeaseGranted) else effect.queued, now)
    elif isinstance(effect, LeaseReleased):
        if effect.lease_id in alloc.leases or effect.lease_id in alloc.waiters:
            alloc.drop(effect.lease_id)  # the flags it may change come as their own effects
    elif isinstance(effect, BorrowedChanged):
        lease = alloc.leases.get(effect.lease_id)
        if lease is not None:
            lease.borrowed = effect.borrowed
    elif isinstance(effect, WaitReason):
        waiter = alloc.waiters.get(effect.lease_id)
        if waiter is not None:
            waiter.reason = effect.reason
    elif isinstance(effect, SharingSet):
        for uuid, mode in effect.modes:
            alloc.set_gpu_sharing(uuid, mode)
    elif isinstance(effect, NodeFlagsSet):
        alloc.set_node_flags(effect.node, cordoned=effect.cordoned, draining=effect.draining)
    elif isinstance(effect, (QuotaSet, QuotaReset)):
        book = alloc.quotas.users if effect.kind == "user" else alloc.quotas.groups
        if effect.spec is None:
            book.pop(effect.name, None)
        else:
            book[effect.name] = effect.spec
    # -- nodes and inventory
    elif isinstance(effect, NodeReachable):
        if effect.node in alloc.nodes:
            alloc.nodes[effect.node].unreachable = not effect.reachable
            alloc.set_node_flags(effect.node)  # re-index it
    elif isinstance(effect, OutsideSet):
        alloc.set_outside(effect.node, effect.holds)
    elif isinstance(effect, Rebound):
        alloc.rebind(effect.lease_id, effect.rebinding, effect.node)
    elif isinstance(effect, (GpuCordoned, RepartitionClosed)):
        if effect.cordoned is not None and effect.gpu in alloc.gpus:
            set_gpu(alloc, effect.gpu, cordoned=effect.cordoned)
    elif isinstance(effect, MigRowsSet) and effect.gpu in alloc.gpus:
        set_gpu(alloc, effect.gpu, instances=[replace(i) for i in effect.instances])
    elif isinstance(effect, RepartitionApplying) and effect.gpu in alloc.gpus:
        instances = effect.instances
        if instances is not None:  # the agent's way: the layout is written now
            set_gpu(alloc, effect.gpu, instances=[replace(i) for i in instances])


def set_gpu(
    alloc: Allocator,
    uuid: str,
    *,
    cordoned: bool | None = None,
    instances: list[MigInstance] | None = None,
) -> None:
    """Cordon a GPU or give it a new MIG layout (what the allocator would be rebuilt with
    from the rows), and re-index its node."""
    gpu = alloc.gpus[uuid]
    if cordoned is not None:
        gpu.cordoned = cordoned
    if instances is not None:
        gpu.instances = instances
    alloc._never.clear()  # what is never placeable may change with a layout
    alloc.set_node_flags(gpu.node)  # re-index it

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
from .headroom import Headroom
from .model import MigInstance, Node, Offer, Request
from .nodeput import put_node, set_gpu
from .offertable import drop_offer, order_offers, put_offer, refresh_demand, set_quota
from .outside import OutsideHolds, Rebinding
from .pricing import Prices
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
class NodeHeld:
    """The node held for a long waiter (``pool.headroom``'s sticky hold) is now ``node``,
    or none (None): remembered on the waiter (``Waiter.hold``) and in its row."""

    lease_id: str
    node: str | None


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
class RestartMarked:
    """The service restarts the server into this granted resize target: the end of the lease it
    replaces (the server's stop) leaves the target alone (``facts.RESTARTING``)."""

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


# -- jobs and kernels


@dataclass(frozen=True)
class NewJob:
    """A job asked now: what its new row keeps (``runner`` None: the local runner's)."""

    id: str
    user: str
    name: str
    offer: str
    workload: str
    command: tuple[str, ...]
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    runner: str | None = None
    runner_ref: Mapping[str, str] | None = None


@dataclass(frozen=True)
class JobSubmitted:
    """A job's row is written, holding the lease ``lease_id`` asked with it (a
    ``LeaseGranted``, ``LeaseQueued`` or ``AwaitingApproval`` just before): the lease is the
    job's (``holder`` job, its class; no server binds it, so it never expires), the job is
    ``granted`` with it or ``queued``."""

    lease_id: str
    job: NewJob


@dataclass(frozen=True)
class JobSeen:
    """The job's runner reported (its heartbeat; ``pid`` when it said one)."""

    job_id: str
    pid: int | None = None


@dataclass(frozen=True)
class JobStarted:
    """The runner started a granted job (granted → running)."""

    job_id: str
    pid: int | None = None


@dataclass(frozen=True)
class JobCancelling:
    """A running job is to be stopped by its runner (→ ``cancelling``); it ends when the
    runner reports the exit."""

    job_id: str


@dataclass(frozen=True)
class JobPreempting:
    """A running job's preemption notice (→ ``preempting``): its runner stops it by
    ``deadline`` (epoch seconds). ``for_request``: the waiter it makes way for, with
    ``grace`` its class's seconds; ``notice``: else the kind of the enforced notice on its
    lease (an administrator's, a drain's, a spent budget's) that it follows."""

    job_id: str
    deadline: float
    reason: str
    for_request: str | None = None
    grace: int | None = None
    notice: str | None = None


@dataclass(frozen=True)
class JobEnded:
    """A job ends as ``state`` (``reason``, ``exit_code``: None leaves them as they are);
    ``lease``: the end of its lease that follows (``pool.ending.finishing``'s effects, the
    pool's own act: audited as the system's), then its audit event ``event`` with ``data``."""

    job_id: str
    state: str
    reason: str | None = None
    exit_code: int | None = None
    lease: tuple[Effect, ...] = ()
    event: str = "job-ended"
    data: tuple[tuple[str, object], ...] = ()


@dataclass(frozen=True)
class KernelRequested:
    """A kernel's lease ``lease_id`` was asked just before: it is the kernel's (``holder``
    kernel, class ``workload``, no expiry), reported alive and busy from now."""

    lease_id: str
    workload: str


@dataclass(frozen=True)
class KernelBusy:
    """The kernel's provisioner reported an execution (its last input is now)."""

    lease_id: str


@dataclass(frozen=True)
class KernelNoticed:
    """An idle kernel's notice: its lease is released at ``deadline`` (epoch seconds) unless
    a cell runs before; ``reason`` is what the user reads."""

    lease_id: str
    deadline: float
    reason: str


@dataclass(frozen=True)
class KernelNoticeCancelled:
    """A kernel under an idle notice ran a cell: the notice is called off."""

    lease_id: str


# -- reclaim and notices


@dataclass(frozen=True)
class ReclaimCounted:
    """A reclaim round counted a window of a lease (its reclaim state after; no notice
    changes, nothing is audited)."""

    lease_id: str
    state: ReclaimState


@dataclass(frozen=True)
class ReclaimNoticed:
    """A reclaim round gives a lease a notice (``state`` has it), with the ``evidence``
    (``pool.reclaim.Evidence`` as a dict) the audit event carries."""

    lease_id: str
    state: ReclaimState
    evidence: Mapping[str, Any] | None


@dataclass(frozen=True)
class ReclaimCancelled:
    """A reclaim round withdraws a lease's notice (the GPU works again, nobody waits):
    ``state`` is its reclaim state after."""

    lease_id: str
    state: ReclaimState
    reason: str
    evidence: Mapping[str, Any] | None


@dataclass(frozen=True)
class ReclaimClaimed:
    """A lease's reclaim action is claimed now (a round's, again once a claim went stale, or
    the service's own for an overdue notice): released with ``release`` when its server
    stops, restarted into ``target`` (a shrink); ``state``: its reclaim state after (None: as
    it is); ``data``: the ``reclaim-acting`` audit event's."""

    lease_id: str
    release: str | None
    target: str | None
    data: Mapping[str, Any]
    state: ReclaimState | None = None


@dataclass(frozen=True)
class ReclaimEnded:
    """A claimed reclaim's outcome (``kind``: ``reclaimed`` or ``reclaim-failed``, the audit
    event with ``data``). ``unclaimed``: the claim ends; ``forgotten``: its release reason and
    shrink target too; ``state``: the user keeps the GPU with this reclaim state (active)."""

    lease_id: str
    kind: str
    data: Mapping[str, Any]
    unclaimed: bool = True
    forgotten: bool = False
    state: ReclaimState | None = None


@dataclass(frozen=True)
class NoticeMoved:
    """An administrator pushes a notice's deadline ``seconds`` later (``state`` has it)."""

    lease_id: str
    state: ReclaimState
    seconds: float


@dataclass(frozen=True)
class ReclaimPolicySet:
    """The administrator's ``reclaim`` section (checked) replaces the config file's."""

    section: Mapping[str, Any]


@dataclass(frozen=True)
class ReclaimPolicyReset:
    """The administrator's ``reclaim`` section is dropped: the config file's applies."""


@dataclass(frozen=True)
class BudgetWarned:
    """A user's or group's budget use crossed a level this period (the audit event's data,
    which the service passes to its notify hook)."""

    warning: Mapping[str, Any]


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


Effect = (
    LeaseGranted
    | LeaseQueued
    | AwaitingApproval
    | LeaseReleased
    | BorrowedChanged
    | WaitReason
    | NodeHeld
    | QuotaSet
    | QuotaReset
    | KeptAlive
    | LeaseActivated
    | RestartMarked
    | NoticeExtended
    | NoticeWithdrawn
    | NoticeGiven
    | RequestDenied
    | NodeFlagsSet
    | RequestApproved
    | SharingSet
    | JobSubmitted
    | JobSeen
    | JobStarted
    | JobCancelling
    | JobPreempting
    | JobEnded
    | KernelRequested
    | KernelBusy
    | KernelNoticed
    | KernelNoticeCancelled
    | ReclaimCounted
    | ReclaimNoticed
    | ReclaimCancelled
    | ReclaimClaimed
    | ReclaimEnded
    | NoticeMoved
    | ReclaimPolicySet
    | ReclaimPolicyReset
    | BudgetWarned
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
    | NodeReported
    | InventoryTaken
    | OfferLoaded
    | OfferDropped
    | FileQuotaLoaded
    | PricesLoaded
    | NodeDeclared
    | ConfigLoaded
    | OffersOrdered
    | HeadroomSet
)


def apply_effect(alloc: Allocator, effect: Effect, now: float) -> None:
    """Make ``effect`` true in the allocator (the applier's in-memory half; the effects on a
    lease's binding and notices, and a job's and a kernel's own, change only rows; a job's
    end changes what its lease's end does)."""
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
    elif isinstance(effect, NodeHeld):
        if (waiter := alloc.waiters.get(effect.lease_id)) is not None:
            waiter.hold = effect.node
    elif isinstance(effect, SharingSet):
        for uuid, mode in effect.modes:
            alloc.set_gpu_sharing(uuid, mode)
    elif isinstance(effect, NodeFlagsSet):
        alloc.set_node_flags(effect.node, cordoned=effect.cordoned, draining=effect.draining)
    elif isinstance(effect, JobEnded):
        for ended in effect.lease:  # the job's lease ends with it
            apply_effect(alloc, ended, now)
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
    elif isinstance(effect, (NodeReported, NodeDeclared)):
        put_node(alloc, effect.node, effect.outside)
    # -- the pool config
    elif isinstance(effect, OfferLoaded):
        put_offer(alloc, effect.offer)
    elif isinstance(effect, OfferDropped):
        drop_offer(alloc, effect.name)
    elif isinstance(effect, OffersOrdered):
        order_offers(alloc, effect.names)
        refresh_demand(alloc)
    elif isinstance(effect, FileQuotaLoaded):
        set_quota(alloc, effect.kind, effect.name, effect.spec)
    elif isinstance(effect, HeadroomSet):
        alloc.headroom = effect.headroom
    elif isinstance(effect, RepartitionApplying) and effect.gpu in alloc.gpus:
        instances = effect.instances
        if instances is not None:  # the agent's way: the layout is written now
            set_gpu(alloc, effect.gpu, instances=[replace(i) for i in instances])

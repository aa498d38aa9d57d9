"""What a decision does, as plain values: the effects ``pool.decide`` returns.

``decide`` only says what is to happen; the store's one applier (``store/apply.py``) makes each
effect true, in order, in one transaction: in the rows (and the audit log) and, through
``apply_effect`` below, in the allocator, the in-memory pool state this package owns. Applied
in order, the effects leave the allocator exactly as the decision saw it would be.

The effect classes live by area (``leaseeffects``: a lease and its request, the quotas;
``jobeffects``: jobs and kernels; ``reclaimeffects``: reclaim and notices; ``nodeeffects``:
nodes, inventory, MIG and the pool config); this module names every one (``Effect``) and is
where the rules and the applier import them from.
"""

from __future__ import annotations

from dataclasses import replace

from .allocator import Allocator
from .jobeffects import (
    JobCancelling,
    JobEnded,
    JobPreempting,
    JobSeen,
    JobStarted,
    JobSubmitted,
    KernelBusy,
    KernelNoticeCancelled,
    KernelNoticed,
    KernelRequested,
    NewJob,
)
from .leaseeffects import (
    AwaitingApproval,
    BorrowedChanged,
    KeptAlive,
    LeaseActivated,
    LeaseGranted,
    LeaseQueued,
    LeaseReleased,
    NewLease,
    NodeFlagsSet,
    NodeHeld,
    NoticeExtended,
    NoticeGiven,
    NoticeWithdrawn,
    QuotaReset,
    QuotaSet,
    RequestApproved,
    RequestDenied,
    RestartMarked,
    SharingSet,
    WaitReason,
)
from .nodeeffects import (
    ConfigLoaded,
    DrainDeadline,
    FileQuotaLoaded,
    GpuCordoned,
    HeadroomSet,
    InventoryTaken,
    LeaseNoted,
    MigCreated,
    MigDestroyed,
    MigFailed,
    MigRowsSet,
    NodeDeclared,
    NodeReachable,
    NodeReported,
    OfferDropped,
    OfferLoaded,
    OffersOrdered,
    OutsideSet,
    PricesLoaded,
    Rebound,
    RepartitionApplying,
    RepartitionClosed,
    RepartitionOpened,
)
from .nodeput import put_node, set_gpu
from .offertable import drop_offer, order_offers, put_offer, refresh_demand, set_quota
from .reclaimeffects import (
    BudgetWarned,
    NoticeMoved,
    ReclaimCancelled,
    ReclaimClaimed,
    ReclaimCounted,
    ReclaimEnded,
    ReclaimNoticed,
    ReclaimPolicyReset,
    ReclaimPolicySet,
)

__all__ = [
    "AwaitingApproval",
    "BorrowedChanged",
    "BudgetWarned",
    "ConfigLoaded",
    "DrainDeadline",
    "Effect",
    "FileQuotaLoaded",
    "GpuCordoned",
    "HeadroomSet",
    "InventoryTaken",
    "JobCancelling",
    "JobEnded",
    "JobPreempting",
    "JobSeen",
    "JobStarted",
    "JobSubmitted",
    "KeptAlive",
    "KernelBusy",
    "KernelNoticeCancelled",
    "KernelNoticed",
    "KernelRequested",
    "LeaseActivated",
    "LeaseGranted",
    "LeaseNoted",
    "LeaseQueued",
    "LeaseReleased",
    "MigCreated",
    "MigDestroyed",
    "MigFailed",
    "MigRowsSet",
    "NewJob",
    "NewLease",
    "NodeDeclared",
    "NodeFlagsSet",
    "NodeHeld",
    "NodeReachable",
    "NodeReported",
    "NoticeExtended",
    "NoticeGiven",
    "NoticeMoved",
    "NoticeWithdrawn",
    "OfferDropped",
    "OfferLoaded",
    "OffersOrdered",
    "OutsideSet",
    "PricesLoaded",
    "QuotaReset",
    "QuotaSet",
    "Rebound",
    "ReclaimCancelled",
    "ReclaimClaimed",
    "ReclaimCounted",
    "ReclaimEnded",
    "ReclaimNoticed",
    "ReclaimPolicyReset",
    "ReclaimPolicySet",
    "RepartitionApplying",
    "RepartitionClosed",
    "RepartitionOpened",
    "RequestApproved",
    "RequestDenied",
    "RestartMarked",
    "SharingSet",
    "WaitReason",
    "apply_effect",
]

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

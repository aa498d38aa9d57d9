"""What a decision reads and returns: ``PoolState`` (the allocator plus the few facts of the
rows the rules need, which the store gathers first), the facts in it, and ``Outcome``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from .allocator import Allocator
from .catalog import Catalog, GpuModel
from .effects import Effect
from .frozen import quick_init
from .holders import Held
from .idlesignal import Signals
from .kernels import KernelRules
from .model import Request
from .noticefacts import Noticed, Shrinkable
from .outside import OutsideHolds
from .quota import QuotaInEffect, QuotaSpec
from .reclaim import LeaseInfo, ReclaimPolicy, ReclaimState
from .reclaimpolicy import PolicySet
from .repartition import Held as GpuHeld
from .workloads import WorkloadClass

#: ``LeaseFacts.reason`` of a granted resize target the service restarts the server into.
RESTARTING = "restarting"


@quick_init
@dataclass(frozen=True)
class LeaseFacts:
    """What the rules read of a lease's row beyond the allocator."""

    id: str
    user: str
    server: str
    state: str
    resize_of: str | None = None
    reason: str | None = None  # ``RESTARTING`` for a target the server restarts into
    reclaiming: bool = False  # a reclaim is acting on it (its stop is the reclaim's)
    reclaim_release: str | None = None  # the reason that reclaim's release is recorded with
    reclaim_target: str | None = None  # the shrink target a reclaim restarts it into
    targets: tuple[LeaseFacts, ...] = ()  # its resize targets not yet bound
    holder: str | None = None  # ``pool.holders``: None (a hub server), ``job`` or ``kernel``
    offer: str = ""
    group: str | None = None
    groups: tuple[str, ...] = ()
    clusters: tuple[str, ...] = ()
    hub: str | None = None
    ready: bool = True  # each of its MIG instances exists (a grant may be bound)
    reclaim_kind: str | None = None  # the kind of the notice it is under, if any
    claimed_action: str | None = None  # the action of a claimed reclaim (refusals say it)
    claimed_at: datetime | None = None  # when it was claimed (aware UTC; None: not claimed)
    reclaim: LeaseInfo | None = None  # its reclaim view (under a notice: what keepalive reads)
    release_reason: str | None = None  # why it ended, if it has


@dataclass(frozen=True)
class Lapsing:
    """A lease or request approved for a while (``LapseApprovals``), as the rule reads it."""

    lease: LeaseFacts
    lapses: float  # when the approved duration ends
    warn_before: float  # the notice's lead (its offer's policy)
    reclaim: ReclaimState = field(default_factory=ReclaimState)
    notice_deadline: float | None = None  # the deadline of the notice it is under, if any


@dataclass(frozen=True)
class Holder:
    """The lease or request a server already has."""

    id: str
    state: str
    hub: str | None


@dataclass(frozen=True)
class JobFacts:
    """What the rules read of a job's row (and of its lease's enforced notice, if any)."""

    id: str
    user: str
    state: str
    lease_id: str | None = None  # its lease (``PoolState.leases`` has its facts if it ends)
    workload: str | None = None
    uid: str | None = None  # a Kueue Workload's uid (``runner_ref``)
    reason: str | None = None
    #: Its lease is under an enforced notice (``reclaiming``): the notice's kind, reason and
    #: deadline (epoch seconds), which the job follows.
    lease_reclaiming: bool = False
    notice_kind: str | None = None
    notice_reason: str | None = None
    notice_deadline: float | None = None


@dataclass(frozen=True)
class KernelFacts:
    """What the rules read of a kernel's lease: its facts, its idle notice's deadline (a
    kernel's own: no reclaim kind), and its last report and last execution (epoch seconds;
    the grant, or the request, before any)."""

    lease: LeaseFacts
    notice_deadline: float | None = None
    last_report: float = 0.0
    last_busy: float = 0.0


@dataclass(frozen=True)
class MigGpu:
    """A GPU as a re-partition or a node's MIG results read its row: its instance rows
    ((profile, start, uuid, failed creations, the last error)), what its node reported
    (``observed``: its JSON entries; None: nothing yet), and what holds it now
    (``pool.repartition.Held``; read for a re-partition only)."""

    uuid: str
    node: str
    model: GpuModel
    mig_enabled: bool
    dynamic: bool
    cordoned: bool
    instances: tuple[tuple[str, int, str | None, int, str | None], ...] = ()
    observed: tuple[Mapping[str, Any], ...] | None = None
    held: tuple[GpuHeld, ...] = ()
    by_claim: bool = False  # the DRA driver's node: mig-parted must not run there

    @property
    def method(self) -> str:
        """How the node gets a layout: its agent (dynamic MIG), else the node's label."""
        return "agent" if self.dynamic and self.mig_enabled else "label"


@dataclass(frozen=True)
class Repartition:
    """A re-partition's row (``id`` 0: the one the command opens)."""

    id: int
    node: str
    gpu: str
    layout: tuple[tuple[str, int], ...]
    method: str
    state: str
    was_cordoned: bool
    actor: str = ""


@dataclass(frozen=True)
class NodeRows:
    """PutInventory: a node's rows as they are now: its flags, its GPUs as the MIG rules read
    them (in the row's order) with each one's sharing mode, the ids of the live leases
    holding each GPU (by uuid, in id order), and the lease holding each MIG instance
    (by (GPU uuid, profile, start): its id, its state, whether the pool made the instance
    for it)."""

    unreachable: bool = False
    cordoned: bool = False
    draining: bool = False
    gpus: tuple[MigGpu, ...] = ()
    sharing: Mapping[str, str | None] = field(default_factory=dict)
    leases: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    slots: Mapping[tuple[str, str, int], tuple[str, str, bool]] = field(default_factory=dict)


@dataclass(frozen=True)
class ConfigRows:
    """LoadConfig: what the rows hold now that a config load may change."""

    #: The offer rows' sources (``file`` | ``api``), by name.
    offers: Mapping[str, str] = field(default_factory=dict)
    #: The quota rows' sources, by (kind, name).
    quotas: Mapping[tuple[str, str], str] = field(default_factory=dict)
    #: The queued requests (their offer in ``LeaseFacts.offer``), by id.
    queued: tuple[LeaseFacts, ...] = ()
    #: The currencies prices are recorded in.
    currencies: frozenset[str] = frozenset()
    #: The offer rows' positions (the allocator's table is in their order), by name.
    positions: Mapping[str, int] = field(default_factory=dict)
    #: Each declared node's rows now (its GPUs' live leases' facts in ``PoolState.leases``),
    #: and its outside marks, by node name (absent: a new node).
    nodes: Mapping[str, NodeRows] = field(default_factory=dict)
    outside: Mapping[str, OutsideHolds] = field(default_factory=dict)
    #: The node each declared GPU belongs to now, by GPU uuid (absent: none yet).
    owners: Mapping[str, str] = field(default_factory=dict)


#: The defaults of the facts most commands leave out: frozen, so one instance serves every
#: ``PoolState`` (not a factory per decision).
_DEFAULT_KERNEL_RULES = KernelRules()
_NO_OUTSIDE = OutsideHolds()
_NO_CONFIG_ROWS = ConfigRows()


@quick_init
@dataclass(frozen=True)
class PoolState:
    """A read-only view of the pool for one decision."""

    alloc: Allocator
    #: The leases a release or an expiry addresses (with their pending targets).
    leases: Mapping[str, LeaseFacts] = field(default_factory=dict)
    #: Allocate: the lease or request the server already has, if any.
    holder: Holder | None = None
    #: Allocate: the user's requests awaiting approval, and the cap on live requests (0: none).
    awaiting: int = 0
    request_cap: int = 0
    #: Allocate: the id of the new request (drawn by the store: decide draws nothing).
    new_id: str = ""
    #: PatchQuota: the quota in effect now.
    quota: QuotaInEffect | None = None
    #: ResetQuota: whether an API override is in effect, and the config file's quota.
    quota_override: bool = False
    file_quota: QuotaSpec | None = None
    #: Keepalive: the reclaim policy of the lease's offer (read only under a notice).
    policy: ReclaimPolicy | None = None
    #: Resize: the live target the lease already has, if any.
    resize_pending: str | None = None
    #: Reconcile: the leases it looks at (the pool's own hub's, in the audit log's order),
    #: and (user, ``job:<id>``) of each live job.
    held: tuple[Held, ...] = ()
    jobs_alive: frozenset[tuple[str, str]] = frozenset()
    #: Approve: the request as asked (its ``Request``) and the duration asked, if any.
    request: Request | None = None
    asked_duration: float | None = None
    #: SetNode: the node is known; an uncordon's drain notices (``uncordon_withdrawals``).
    node_known: bool = False
    drained: tuple[tuple[LeaseFacts, ReclaimState, float], ...] = ()
    #: SetSharing: the node's GPUs (uuid, sharing mode now, MIG enabled), in its order.
    node_gpus: tuple[tuple[str, str, bool], ...] = ()
    #: LapseApprovals: the leases and requests whose approved duration ends some time.
    lapsing: tuple[Lapsing, ...] = ()
    # -- jobs and kernels
    #: SubmitJob, KueueJob, RequestKernel: the pool config's workload classes.
    classes: Mapping[str, WorkloadClass] = field(default_factory=dict)
    #: SubmitJob, KueueJob: the new job's id (drawn by the store, as ``new_id``).
    new_job_id: str = ""
    #: CancelJob, JobStatus, EndKubeJob: the job addressed (None: there is no such job).
    job: JobFacts | None = None
    #: KueueJob: the jobs of the Workload's name, newest first; PreemptJobs: the live jobs
    #: (granted to preempting, each with a lease), oldest first.
    jobs: tuple[JobFacts, ...] = ()
    #: PreemptJobs: the class of each queued or live lease that has one, by lease id.
    workloads: Mapping[str, str | None] = field(default_factory=dict)
    #: RequestKernel: the kernel's live lease; ReleaseKernel, KernelActivity: its newest one.
    kernel: KernelFacts | None = None
    #: ReapKernels: the live kernel leases, oldest first, and the reaper's timings.
    kernels: tuple[KernelFacts, ...] = ()
    kernel_rules: KernelRules = _DEFAULT_KERNEL_RULES
    # -- reclaim and notices
    #: ReclaimRound: the watched leases no one acts on (in the round's order), what is known
    #: of each over the window (by id), the policies in effect, the leases whose action is
    #: claimed, the bounds of stale data and of a claim, the shrinks' facts (by lease id),
    #: the clusters the pool knows (a shrink's target asks for the lease's).
    watched: tuple[LeaseInfo, ...] = ()
    signals: Mapping[str, Signals] = field(default_factory=dict)
    policies: PolicySet | None = None
    claimed: tuple[Noticed, ...] = ()
    stale_after: float = 120.0
    claim_timeout: float = 600.0
    shrinks: Mapping[str, Shrinkable] = field(default_factory=dict)
    clusters: tuple[str, ...] = ()
    #: AdminReclaim, ExtendNotice, CancelNotice, ReclaimOutcome, NoticeEnforced: the lease
    #: (its facts in ``leases``); EnforceNotices: the overdue notices no one carries out;
    #: BudgetRound: the live leases (in the order a spent budget gives its notices).
    noticed: tuple[Noticed, ...] = ()
    #: PutReclaimPolicy: the catalog a shrink target is checked with; ResetReclaimPolicy:
    #: whether an administrator's section is in effect.
    catalog: Catalog | None = None
    policy_override: bool = False
    #: BudgetRound: the budget warnings given in the periods running now ((subject, name,
    #: level, when), epoch seconds).
    warned: tuple[tuple[str, str, int, float], ...] = ()
    #: AdminReclaim, CancelNotice: who asks (the notice's words name them).
    actor: str = ""
    # -- nodes and inventory
    #: DrainNode: the node's live leases (granted, then by id), each with its reclaim state.
    on_node: tuple[tuple[LeaseFacts, ReclaimState], ...] = ()
    #: MarkUnreachable: the nodes whose agents went silent; AddBusy: the node is unreachable.
    silent: tuple[str, ...] = ()
    unreachable: bool = False
    #: SetOutside, Rebind: the node's outside marks now (its row's).
    outside: OutsideHolds = _NO_OUTSIDE
    #: RequestRepartition: the GPU (None: not on that node) and its open re-partition; the
    #: leases in the way, noticed (``on_node``, by id).
    mig_gpu: MigGpu | None = None
    open_repartition: Repartition | None = None
    #: CancelRepartition, FailRepartition, AdvanceRepartitions: the re-partitions with their
    #: GPU (None: gone), and the failed creations after which the node gives up.
    repartitions: tuple[tuple[Repartition, MigGpu | None], ...] = ()
    mig_attempts: int = 3
    #: MigResults: the node's GPUs (None: no such node), and the lease (id, state) holding
    #: each MIG instance of theirs, by (GPU uuid, profile, start).
    mig_node: tuple[MigGpu, ...] | None = None
    mig_holders: Mapping[tuple[str, str, int], tuple[str, str]] = field(default_factory=dict)
    #: PutInventory: the node's rows (None: a new node; its lease facts in ``leases``, its
    #: marks in ``outside``), the node each reported GPU of another node belongs to (by
    #: uuid), the nodes and clusters whose MIG is the DRA driver's (``pool.dramig``), and
    #: the clusters the pool knows (``clusters``).
    node_rows: NodeRows | None = None
    elsewhere: Mapping[str, str] = field(default_factory=dict)
    dra: frozenset[str] = frozenset()
    # -- the pool config
    #: LoadConfig: the rows the load changes.
    config_rows: ConfigRows = _NO_CONFIG_ROWS


@quick_init
@dataclass(frozen=True)
class Outcome:
    """What a command answers (before serialization) and the effects that make it true."""

    answer: Any
    effects: tuple[Effect, ...] = ()


#: A rule: what ``decide`` calls for one command type.
Rule = Callable[[PoolState, Any, float], Outcome]

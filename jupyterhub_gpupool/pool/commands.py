"""Every change of the pool's state, as a typed command.

A handler or a background loop builds one of these and hands it to the service's writer
(``await writer.run(Release(lease_id, reason="stopped", actor=who))``); the writer queues it,
runs it off the event loop and answers after its commit. The type says how it may be run:

* ``batchable``: the command refuses, if at all, before it writes anything, so it may share one
  transaction (one lock, one version bump, one commit) with its neighbours in the queue (group
  commit). Every other command runs in a transaction of its own, in the same queue.
* which store method applies it: the store's table (``store.dispatch``) names one method per
  type, whose parameters are the command's fields (a test checks both ways). The table lives
  there, not here, because ``pool/`` imports nothing of the store.

``actor`` is who asked (``user:alice``, ``admin:bob``, ``service:gpupool``...) and is written
to the audit log by the commands that audit; a few bookkeeping commands (``ExpireGrants``,
``WriteMinutes``...) audit as the system and keep it only for the record.

Commands are plain frozen values: they pickle (the writer may run them in a child process) and
compare equal by value, which tests use. Fields keep the store's defaults.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, ClassVar

from .frozen import quick_init
from .model import Node


@dataclass(frozen=True)
class Command:
    """A change of the pool's state (abstract: only its subclasses are run)."""

    #: Whether it may share a transaction with other batchable commands (group commit).
    batchable: ClassVar[bool] = False
    #: Who asked, for the audit log.
    actor: str = field(default="", kw_only=True)


# -- leases -----------------------------------------------------------------------------------


@quick_init
@dataclass(frozen=True)
class Allocate(Command):
    """Ask for an offer for a user's server: a lease granted, queued or awaiting approval."""

    batchable: ClassVar[bool] = True
    user: str
    server: str
    offer: str
    group: str | None = None
    groups: Iterable[str] = ()
    priority: int | None = None
    resize_of: str | None = None
    clusters: Iterable[str] = ()
    reason: str = ""
    duration: float | None = None
    hub: str | None = None
    check_cap: bool = True
    #: Copies of the offer in one grant (a job's replicas, ``workloads.check_replicas``).
    replicas: int = 1


@quick_init
@dataclass(frozen=True)
class Release(Command):
    """End a lease (its slots freed, the queue served)."""

    batchable: ClassVar[bool] = True
    lease_id: str
    reason: str = "stopped"


@quick_init
@dataclass(frozen=True)
class Keepalive(Command):
    """Bind a ready grant to its server, or keep a lease past its reclaim notice."""

    batchable: ClassVar[bool] = True
    lease_id: str


@dataclass(frozen=True)
class SetServerUrl(Command):
    """Record where the lease's server listens, so the reclaimer reads it without the proxy
    (which would stamp its reads as the user's activity)."""

    lease_id: str
    url: str


@dataclass(frozen=True)
class ReportPresence(Command):
    """The lab's report of the user's input, ``idle_for`` seconds ago (None: the lab runs and
    will report; from then on only these reports are the lease's presence)."""

    lease_id: str
    idle_for: float | None


@dataclass(frozen=True)
class Resize(Command):
    """Reserve another offer for a lease (make-before-break)."""

    lease_id: str
    offer: str
    check_cap: bool = True


@dataclass(frozen=True)
class MarkRestarting(Command):
    """Note that the lease's server is being restarted into its resize target."""

    lease_id: str


@dataclass(frozen=True)
class ExpireGrants(Command):
    """Release grants never bound within the grant timeout."""

    batchable: ClassVar[bool] = True


@dataclass(frozen=True)
class Promote(Command):
    """Serve the queue (aging changes its order over time)."""

    batchable: ClassVar[bool] = True


@dataclass(frozen=True)
class Reconcile(Command):
    """Release leases whose servers the hub no longer runs (or has deleted)."""

    running: set[tuple[str, str]]
    reason: str = "stopped"
    older_than: datetime | None = None
    deleted: Iterable[tuple[str, str]] = ()
    actor: str = field(default="system", kw_only=True)


# -- approvals and budgets --------------------------------------------------------------------


@dataclass(frozen=True)
class Approve(Command):
    """Approve a request awaiting approval (it joins the queue)."""

    lease_id: str
    duration: float | None = None
    offer: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Deny(Command):
    """Deny a request awaiting approval (released, reason ``denied``)."""

    lease_id: str
    reason: str


@dataclass(frozen=True)
class LapseApprovals(Command):
    """Approved time running out: a notice first, then the lease ends."""


@dataclass(frozen=True)
class BudgetRound(Command):
    """Budget warnings, and notices for the running leases of a spent ``stop`` budget."""

    warn_before: float = 600.0


@dataclass(frozen=True)
class RecordRefusal(Command):
    """Count a refused ask of an offer (capacity planning)."""

    offer: str
    code: str


# -- configuration, nodes, quotas -------------------------------------------------------------


@dataclass(frozen=True)
class LoadConfig(Command):
    """Apply the pool config file (offers, quotas, nodes declared there)."""

    config: Any  # poolconfig.PoolConfig (outside pool/)


@dataclass(frozen=True)
class SetNode(Command):
    """Cordon, uncordon or drain a node."""

    name: str
    action: str


@dataclass(frozen=True)
class DrainNode(Command):
    """Drain a node by a deadline: notices to its leases, then the action."""

    name: str
    deadline: datetime | None = None
    action: str = "stop"


@dataclass(frozen=True)
class PutQuota(Command):
    """Replace a user's or group's quota override."""

    kind: str
    name: str
    raw: Mapping[str, object]


@dataclass(frozen=True)
class PatchQuota(Command):
    """Change some fields of a user's or group's quota override."""

    kind: str
    name: str
    raw: Mapping[str, object]


@dataclass(frozen=True)
class ResetQuota(Command):
    """Drop a quota override: back to the config file's."""

    kind: str
    name: str


# -- agents and telemetry ---------------------------------------------------------------------


@dataclass(frozen=True)
class PutInventory(Command):
    """Replace a node's inventory as its agent reports it."""

    node: Node


@dataclass(frozen=True)
class AddBusy(Command):
    """Add busy time per lease and minute (usage), and keep the raw samples for reclaim rounds."""

    usage: Mapping[Any, Any]  # (lease id, minute) -> store.usagefacts.BusyTime
    node: str | None = None
    samples: Sequence[Any] = ()  # store.utilization.SampleFields (service.utilization.Sample)


@dataclass(frozen=True)
class MarkUnreachable(Command):
    """Mark the nodes whose agents went silent since a time."""

    silent_since: datetime


@dataclass(frozen=True)
class MigResults(Command):
    """Record what a node's agent did of its MIG plan (instances made, failures)."""

    node: str
    results: Iterable[Mapping[str, Any]]


@dataclass(frozen=True)
class WriteMinutes(Command):
    """Write utilization minute aggregates."""

    minutes: Mapping[Any, Any]  # store.utilization.MinuteKey -> MinuteTotals


@dataclass(frozen=True)
class PruneMinutes(Command):
    """Delete utilization minutes older than a time."""

    before: datetime


@dataclass(frozen=True)
class PruneSamples(Command):
    """Delete raw utilization samples older than a time (epoch seconds)."""

    before: float


# -- idle reclaim -----------------------------------------------------------------------------


@dataclass(frozen=True)
class TakeLeader(Command):
    """Take (or renew) the reclaimer's leader lock."""

    holder: str
    ttl: float = 60.0


@dataclass(frozen=True)
class GiveUpLeader(Command):
    """Give up the reclaimer's leader lock."""

    holder: str


@dataclass(frozen=True)
class ReclaimRound(Command):
    """One reclaim round: notices and actions decided from the observations and samples."""

    holder: str
    window: tuple[float, float]
    observed: Mapping[str, Any]  # lease id -> pool.reclaim.Observation
    # device -> pool.idlesignal.GpuSample; None (the service): the window's stored samples
    samples: Mapping[Any, Sequence[Any]] | None = None


@dataclass(frozen=True)
class ReclaimOutcome(Command):
    """Record what the reclaimer did with a claimed action."""

    lease_id: str
    holder: str
    result: str
    saved: Iterable[str] = ()
    detail: str = ""


@dataclass(frozen=True)
class PutReclaimPolicy(Command):
    """Override the reclaim policy from the API."""

    section: Mapping[str, Any]


@dataclass(frozen=True)
class ResetReclaimPolicy(Command):
    """Drop the reclaim policy override: back to the config file's."""


@dataclass(frozen=True)
class AdminReclaim(Command):
    """An administrator reclaims a lease now (or after a grace)."""

    lease_id: str
    immediately: bool = False
    grace: float | None = None
    action: str = "stop"
    reason: str = ""


@dataclass(frozen=True)
class ExtendNotice(Command):
    """Push a reclaim notice's deadline back."""

    lease_id: str
    seconds: float


@dataclass(frozen=True)
class CancelNotice(Command):
    """Withdraw a reclaim notice."""

    lease_id: str
    reason: str = ""


@dataclass(frozen=True)
class EnforceNotices(Command):
    """Claim the admin and drain notices overdue by some seconds that no reclaimer took."""

    overdue: float


@dataclass(frozen=True)
class NoticeEnforced(Command):
    """Record the outcome of an enforced notice."""

    lease_id: str
    stopped: bool
    detail: str = ""


# -- alerts and MIG re-partitions -------------------------------------------------------------


@dataclass(frozen=True)
class RecordAlerts(Command):
    """Audit alerts that started or ended."""

    changes: list[Mapping[str, Any]]


@dataclass(frozen=True)
class RequestRepartition(Command):
    """Plan a MIG re-partition of a GPU (notices to its leases first)."""

    node: str
    gpu: str
    layout: object
    notice_seconds: float | None = None


@dataclass(frozen=True)
class CancelRepartition(Command):
    """Cancel a planned MIG re-partition."""

    rep_id: int


@dataclass(frozen=True)
class AdvanceRepartitions(Command):
    """Start re-partitions nothing is in the way of any more; close finished ones."""


@dataclass(frozen=True)
class FailRepartition(Command):
    """Record that a re-partition failed."""

    rep_id: int
    error: str


# -- jobs -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SubmitJob(Command):
    """Ask for an offer for a job of a workload class: its lease granted or queued."""

    user: str
    offer: str
    command: Sequence[str]
    workload: str = "training"
    name: str = ""
    group: str | None = None
    groups: Iterable[str] = ()
    env: Mapping[str, str] | None = None
    cwd: str | None = None
    #: a container image: Kubernetes runs the job (a Job, or a Deployment for inference)
    image: str | None = None
    #: copies of the offer (class inference): the quota counts them all
    replicas: object = 1


@dataclass(frozen=True)
class CancelJob(Command):
    """End a queued or granted job at once; a running one goes ``cancelling``."""

    job_id: str


@dataclass(frozen=True)
class JobStatus(Command):
    """The job runner's report: ``running`` (its heartbeat) or ``exited`` (releases the
    lease)."""

    job_id: str
    state: str
    exit_code: int | None = None
    pid: int | None = None


@dataclass(frozen=True)
class AppendJobLog(Command):
    """Add the runner's upload of a job's output at ``offset``."""

    job_id: str
    offset: int
    data: str


@dataclass(frozen=True)
class PreemptJobs(Command):
    """Give preemptible jobs whose leases a waiting request within guarantee needs, or a long
    waiter of a class with ``preempt_for_waiters`` on the node held for it, their notice
    (``preempting``, with a deadline)."""


@dataclass(frozen=True)
class KueueJob(Command):
    """The job of a Kueue Workload that carries the pool's AdmissionCheck: its live one, or a
    new one asking for the offer (granted or queued)."""

    user: str
    offer: str
    workload: str
    namespace: str
    name: str
    uid: str


@dataclass(frozen=True)
class EndKubeJob(Command):
    """A job Kubernetes runs (a Kueue Workload, or a Job/Deployment the pool created)
    ``succeeded``, ``failed``, was ``deleted`` or ``evicted``: it ends, its lease is released."""

    job_id: str
    outcome: str
    message: str = ""


# -- kernels ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestKernel(Command):
    """Ask for an offer for a notebook kernel (its lease granted or queued; the same kernel
    and offer again: the lease it has)."""

    user: str
    offer: str
    kernel_id: str
    group: str | None = None
    groups: Sequence[str] = ()


@dataclass(frozen=True)
class ReleaseKernel(Command):
    """End a kernel's lease (shut down, restarted with another offer, given up waiting)."""

    kernel_id: str


@dataclass(frozen=True)
class KernelActivity(Command):
    """The kernel provisioner's report: the kernel is alive, ``busy`` or ``idle``."""

    kernel_id: str
    state: str


@dataclass(frozen=True)
class ReapKernels(Command):
    """Release kernel leases nobody reports any more, notice idle kernels, release those whose
    notice ran out."""


def every_command() -> list[type[Command]]:
    """Every concrete command type (the store's dispatch table has one line for each)."""
    return list(Command.__subclasses__())


# -- what the cluster says ----------------------------------------------------------------------


@dataclass(frozen=True)
class Rebind(Command):
    """Move a lease onto the devices its server really got (the kubelet's PodResources, or a
    DRA claim's allocation); what held them takes what the lease leaves."""

    lease_id: str
    devices: Sequence[str]
    #: DRA: a device another lease holds is refused, not swapped
    exclusive: bool = False


@dataclass(frozen=True)
class SetOutside(Command):
    """Mark as many devices of a node as pods the pool did not place hold (never granted);
    with ``devices`` (DRA: the cluster names them, ``pool.outside.Held``), exactly those."""

    node: str
    counts: Mapping[str, int]
    pods: Sequence[str] = ()
    devices: Sequence[tuple[str, int | None, str]] | None = None


@dataclass(frozen=True)
class SetSharing(Command):
    """Set a node's GPUs' sharing modes (uuid → shared | exclusive) as its device plugin
    advertises them."""

    name: str
    modes: Mapping[str, str]

"""The effects on a lease and its request (``pool.effects``): granted, queued, awaiting
approval, released; its binding, notices, approval and flags; the quotas and a node's flags and
sharing that the lease rules change."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

from .approval import Ask
from .decisions import Grant, Queued
from .model import Request
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

"""A lease as the pool shows it: ``LeaseView`` (its slots, its reclaim notice, the devices it
could fall back to), built by ``lease_view`` from the lease's row and the allocator held still.

What the builder needs beyond the row comes in as arguments (``now``, the queue positions of a
page) or small callables (an offer's release rate, its policy's extensions), so it reads no
store state of its own: the store's thin methods open the session, hold the allocator and pass
them. A view is frozen and pickles (it crosses the writer process's pipe).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ... import orm
from ...pool.allocator import Allocator
from ...pool.fallback import fallback_devices
from ...pool.frozen import quick_init
from ...pool.leases import is_ready
from ...pool.queue import estimate_wait
from ...pool.reclaim import notice_words
from ..rows import mig_devices, reclaim_state


@quick_init
@dataclass(frozen=True)
class SlotView:
    """One device a lease holds: a whole GPU, a MIG instance (``mig_uuid`` once it exists and
    the lease is live) or a share (``milli``)."""

    gpu: str
    kind: str
    profile: str | None
    start: int | None
    milli: int
    mig_uuid: str | None = None


@dataclass(frozen=True)
class FallbackView:
    """A free device of the lease's node that could serve its offer besides its own (for the
    server's claim, DRA ``firstAvailable``)."""

    gpu: str
    kind: str
    profile: str | None
    start: int | None


@dataclass(frozen=True)
class ReclaimView:
    """A lease's reclaim notice as the user and the reclaimer see it (``heading``, ``keep``,
    ``why_not_kept``: ``pool.reclaim.notice_words``)."""

    kind: str | None
    deadline: datetime | None
    reason: str | None
    action: str | None
    issued: datetime | None
    pressure: bool
    extensions: int
    max_extensions: int
    extendable: bool
    acting: bool
    heading: str
    keep: bool
    why_not_kept: str | None


@quick_init
@dataclass(frozen=True)
class LeaseView:
    """One lease: its row's facts, its place in the queue (``position``, ``eta_seconds``:
    queued only), its notice, whether it can be run on (``ready``), its node's ``cluster`` and,
    for a grant, the devices it could fall back to (``fallback``: empty when none)."""

    id: str
    user: str
    server: str
    offer: str
    group: str | None
    state: str
    reason: str | None
    message: str | None
    units: float
    borrowed: bool
    node: str | None
    model: str | None
    created: datetime
    granted: datetime | None
    activated: datetime | None
    released: datetime | None
    release_reason: str | None
    expires: datetime | None
    resize_of: str | None
    hub: str | None
    approval: Mapping[str, Any] | None
    exception: bool
    lapses: datetime | None
    slots: tuple[SlotView, ...]
    ready: bool
    cluster: str | None
    position: int | None = None
    eta_seconds: float | None = None
    reclaim: ReclaimView | None = None
    fallback: tuple[FallbackView, ...] = ()


def reclaim_view(row: orm.LeaseRow, max_extensions: int) -> ReclaimView:
    """The notice ``row`` carries; ``max_extensions``: its offer's policy's."""
    extensions = reclaim_state(row).extensions
    acting = row.reclaim_acting is not None
    words = notice_words(row.reclaim_kind or "", extensions, max_extensions, acting)
    return ReclaimView(
        kind=row.reclaim_kind,
        deadline=row.reclaim_deadline,
        reason=row.reclaim_reason,
        action=row.reclaim_action,
        issued=row.reclaim_issued,
        pressure=bool(row.reclaim_pressure),
        extensions=extensions,
        max_extensions=max_extensions,
        extendable=not acting
        and row.reclaim_kind in ("idle", "cpu")
        and extensions < max_extensions,
        acting=acting,
        heading=str(words["heading"]),
        keep=bool(words["keep"]),
        why_not_kept=None if words["why_not_kept"] is None else str(words["why_not_kept"]),
    )


def lease_view(
    alloc: Allocator | None,
    row: orm.LeaseRow,
    *,
    now: float,
    release_rate: Callable[[str], float],
    max_extensions: Callable[[str], int],
    positions: Mapping[str, int] | None = None,
) -> LeaseView:
    """``row`` as a ``LeaseView``. ``alloc`` None: no live facts (no position, cluster,
    fallback or MIG uuids). ``now`` (epoch seconds): for a queued lease's position;
    ``positions``: the queue's, read once for a page; ``release_rate``: an offer's releases in
    the last hour (asked only for a queued lease with a position); ``max_extensions``: an
    offer's policy's (asked only for a lease under notice)."""
    position: int | None = None
    eta: float | None = None
    # each column once: a mapped attribute's read is a Python call (a view per command)
    lease_id, state, offer_name, node_name = row.id, row.state, row.offer, row.node
    if state == "queued" and alloc is not None:
        position = alloc.position(lease_id, now) if positions is None else positions.get(lease_id)
        if position is not None:
            eta = estimate_wait(position, release_rate(offer_name))
    devices = mig_devices(alloc, row)
    live = state in orm.LIVE_STATES
    slots = tuple(
        SlotView(
            s.gpu_uuid,
            s.kind,
            s.profile,
            s.start,
            s.milli,
            devices[(s.gpu_uuid, s.start)][0] if s.kind == "mig" and live else None,
        )
        for s in row.slots
    )
    node = alloc.nodes.get(node_name) if alloc is not None and node_name else None
    lease = alloc.leases.get(lease_id) if alloc is not None else None
    offer = alloc.offers.get(offer_name) if alloc is not None else None
    fallback: tuple[FallbackView, ...] = ()
    if state == "granted" and node is not None and lease is not None and offer:
        fallback = tuple(
            FallbackView(s.gpu, s.kind, s.profile, s.start)
            for s in fallback_devices(node, offer, lease.slots)
        )
    notice = None
    if row.reclaim_deadline is not None and row.reclaim_kind is not None:
        notice = reclaim_view(row, max_extensions(offer_name))
    approval = row.approval
    return LeaseView(
        id=lease_id,
        user=row.user,
        server=row.server,
        offer=offer_name,
        group=row.group,
        state=state,
        reason=row.reason,
        message=row.message,
        units=row.units_f,
        borrowed=row.borrowed,
        node=node_name,
        model=row.model,
        created=row.created,
        granted=row.granted,
        activated=row.activated,
        released=row.released,
        release_reason=row.release_reason,
        expires=row.expires,
        resize_of=row.resize_of,
        hub=row.hub,
        approval=None if approval is None else dict(approval),
        exception=bool(row.exception),
        lapses=row.lapses,
        slots=slots,
        ready=is_ready(state, [made for _, made in devices.values()]),
        cluster=node.cluster if node is not None else None,
        position=position,
        eta_seconds=eta,
        reclaim=notice,
        fallback=fallback,
    )


@dataclass(frozen=True)
class WatchedLeaseView:
    """A live lease the reclaimer watches: where its server is (``server_url`` None: through
    the proxy) and its notice, if any."""

    id: str
    user: str
    server: str
    offer: str
    state: str
    node: str | None
    granted: datetime | None
    server_url: str | None
    reclaim: ReclaimView | None


def watched_lease_view(row: orm.LeaseRow, reclaim: ReclaimView | None) -> WatchedLeaseView:
    """``row`` as the reclaimer's list shows it; ``reclaim``: its notice (``reclaim_view``)."""
    return WatchedLeaseView(
        row.id,
        row.user,
        row.server,
        row.offer,
        row.state,
        row.node,
        row.granted,
        row.server_url,
        reclaim,
    )

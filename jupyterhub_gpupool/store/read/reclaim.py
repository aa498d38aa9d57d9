"""The reclaimer's reads and answers: the reclaim policies in effect (``GET reclaim/policies``
and the answer of a change: the section as written, where it comes from, and each offer's
resolved policy, ``pool``'s own ``ReclaimPolicy``, already a frozen value), the leader lock, a
round's decisions, the overdue notices the service claims, and the user's past reclaims and
withdrawn notices."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from ... import orm
from ...pool.model import Offer
from ...pool.reclaimpolicy import PolicySet, ReclaimPolicy
from ...pool.rules.reclaim import Said
from ..rows import naive

__all__ = [
    "EnforcedNoticeView",
    "LeaderView",
    "PastReclaimView",
    "ReclaimDecisionView",
    "ReclaimMinute",
    "ReclaimPolicyView",
    "ReclaimRoundView",
    "WithdrawnNoticeView",
    "decision_view",
    "enforced_notice_view",
    "past_reclaim_view",
    "reclaim_policy_view",
    "round_view",
    "withdrawn_notice_view",
]


@dataclass(frozen=True)
class ReclaimPolicyView:
    """``source``: ``api`` (the admin's override), ``file`` (the pool config) or ``default``;
    ``section``: the ``reclaim`` section as written (empty for the defaults); ``default`` and
    ``offers``: the policies that apply, resolved against today's offers."""

    source: str
    section: Mapping[str, Any]
    default: ReclaimPolicy
    offers: Mapping[str, ReclaimPolicy]


def reclaim_policy_view(
    section: Mapping[str, Any] | None,
    source: str,
    policies: PolicySet,
    offers: Mapping[str, Offer],
) -> ReclaimPolicyView:
    """The policies in effect: ``section`` (from ``source``) resolved as ``policies`` for
    every one of ``offers``."""
    return ReclaimPolicyView(
        source=source,
        section=dict(section or {}),
        default=policies.default,
        offers={name: policies.for_offer(o) for name, o in offers.items()},
    )


# -- the leader lock -------------------------------------------------------------------------


@dataclass(frozen=True)
class LeaderView:
    """The reclaimer's leader lock after a take or a give-up: who holds it until when (None:
    nobody, or it ran out), and whether the asker leads."""

    holder: str | None
    expires: datetime | None
    leader: bool


# -- a round ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReclaimDecisionView:
    """What a round decided of one lease (``pool.rules.reclaim.Said``) with who holds it:
    ``kind`` and ``reason`` always; the rest only where the decision says it (None: not said).
    ``offer_name`` is the offer's display name (what the notify hook's messages read)."""

    lease: str
    user: str
    server: str
    offer: str
    offer_name: str
    kind: str
    reason: str
    action: str | None = None
    deadline: datetime | None = None
    release_reason: str | None = None
    target_offer: str | None = None
    target_lease: str | None = None
    evidence: Mapping[str, Any] | None = None
    notice_kind: str | None = None
    heading: str | None = None
    keep: bool | None = None
    why_not_kept: str | None = None


@dataclass(frozen=True)
class ReclaimRoundView:
    """A round's answer: the pool's clock (epoch seconds), one decision per lease in the
    round's order, and how many were ``stale``."""

    now: float
    decisions: tuple[ReclaimDecisionView, ...]
    stale: int


#: The keys a round's ``Said.extra`` may carry (a ``ReclaimDecisionView`` field each).
_SAID = frozenset(
    (
        "action",
        "deadline",
        "release_reason",
        "target_offer",
        "target_lease",
        "evidence",
        "notice_kind",
        "heading",
        "keep",
        "why_not_kept",
    )
)


def decision_view(row: orm.LeaseRow, offer_name: str, said: Said) -> ReclaimDecisionView:
    """``said`` of the lease of ``row``; ``offer_name``: its offer's display name. Its
    ``deadline`` (the rules' aware UTC ``datetime``) becomes the views' naive UTC."""
    extra = {k: v for k, v in said.extra.items() if v is not None}
    unknown = set(extra) - _SAID
    if unknown:  # a new field of the rules must get a view field, not be dropped
        raise ValueError(f"a reclaim decision says {sorted(unknown)}: no view field")
    evidence = extra.get("evidence")
    return ReclaimDecisionView(
        lease=row.id,
        user=row.user,
        server=row.server,
        offer=row.offer,
        offer_name=offer_name,
        kind=said.kind,
        reason=said.reason,
        action=extra.get("action"),
        deadline=naive(extra.get("deadline")),
        release_reason=extra.get("release_reason"),
        target_offer=extra.get("target_offer"),
        target_lease=extra.get("target_lease"),
        evidence=None if evidence is None else dict(evidence),
        notice_kind=extra.get("notice_kind"),
        heading=extra.get("heading"),
        keep=extra.get("keep"),
        why_not_kept=extra.get("why_not_kept"),
    )


def round_view(now: float, decisions: Iterable[ReclaimDecisionView]) -> ReclaimRoundView:
    """A round's answer from its decisions."""
    said = tuple(decisions)
    return ReclaimRoundView(now, said, sum(1 for d in said if d.kind == "stale"))


# -- overdue notices the service carries out -------------------------------------------------


@dataclass(frozen=True)
class EnforcedNoticeView:
    """An overdue admin or drain notice the service claimed (``EnforceNotices``): whose server
    to stop, and the notice's terms."""

    lease: str
    user: str
    server: str
    kind: str | None
    action: str | None
    deadline: datetime | None
    reason: str | None


def enforced_notice_view(claimed: Mapping[str, Any]) -> EnforcedNoticeView:
    """One claim the notice rules answered (``pool.rules.notices``; its aware UTC
    ``deadline`` as the views' naive UTC)."""
    return EnforcedNoticeView(
        lease=claimed["lease"],
        user=claimed["user"],
        server=claimed["server"],
        kind=claimed["kind"],
        action=claimed["action"],
        deadline=naive(claimed["deadline"]),
        reason=claimed["reason"],
    )


# -- the user's page -------------------------------------------------------------------------


@dataclass(frozen=True)
class ReclaimMinute:
    """One minute of a reclaimed lease's last hour: the mean utilization over its devices
    (None: no samples) and the most memory any of them used."""

    minute: datetime
    util_mean: float | None
    memory_used_mib_max: int


@dataclass(frozen=True)
class PastReclaimView:
    """A reclaim of the user's (done or failed): which lease, when, what and why, the files
    saved, and the lease's minutes over its last hour."""

    lease: str | None
    offer: str | None
    server: str | None
    at: datetime
    kind: str | None
    action: str | None
    reason: str | None
    release_reason: str | None
    saved: tuple[str, ...]
    outcome: str
    detail: str
    utilization: tuple[ReclaimMinute, ...]


@dataclass(frozen=True)
class WithdrawnNoticeView:
    """A notice of the user's an administrator withdrew: which lease, what kind, when, why."""

    lease: str | None
    offer: str | None
    server: str | None
    at: datetime
    kind: str | None
    reason: str


def past_reclaim_view(
    event: orm.EventRow, row: orm.LeaseRow | None, utilization: Iterable[ReclaimMinute]
) -> PastReclaimView:
    """The reclaim ``event`` (``reclaimed`` or ``reclaim-failed``) of the lease ``row`` (None:
    not found)."""
    data = event.data or {}
    done = event.kind == "reclaimed"
    return PastReclaimView(
        lease=event.lease_id,
        offer=row.offer if row else None,
        server=row.server if row else None,
        at=event.ts,
        kind=data.get("kind"),
        action=data.get("action"),
        reason=data.get("reason"),
        release_reason=data.get("release_reason") if done else None,
        saved=tuple(data.get("saved") or ()),
        outcome="done" if done else "failed",
        detail=data.get("detail") or "",
        utilization=tuple(utilization),
    )


def withdrawn_notice_view(event: orm.EventRow, row: orm.LeaseRow | None) -> WithdrawnNoticeView:
    """The ``reclaim-cancelled`` ``event`` of an administrator, of the lease ``row``."""
    data = event.data or {}
    return WithdrawnNoticeView(
        lease=event.lease_id,
        offer=row.offer if row else None,
        server=row.server if row else None,
        at=event.ts,
        kind=data.get("kind"),
        reason=data.get("reason") or "",
    )

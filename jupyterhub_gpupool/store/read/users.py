"""A user's page as the pool answers it (``GET users/{name}``, the user page): the quota in
effect, what the user holds and used, the live leases with their notices, and the recent
reclaims and withdrawn notices (``store.read.reclaim``)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from ...pool.quota import QuotaSpec
from .leases import LeaseView
from .reclaim import PastReclaimView, WithdrawnNoticeView

__all__ = ["UserNoticeView", "UserView", "user_notices"]


@dataclass(frozen=True)
class UserNoticeView:
    """A reclaim notice on one of the user's live leases: its reason (what the user reads),
    the action it ends in and its deadline."""

    lease: str
    reason: str | None
    action: str | None
    deadline: datetime | None


@dataclass(frozen=True)
class UserView:
    """``quota``: the user's quota in effect; ``held_units``: GPU units held now;
    ``used_unit_hours``: the budget's use (None: no budget applies)."""

    name: str
    groups: tuple[str, ...]
    quota: QuotaSpec
    held_units: float
    used_unit_hours: float | None
    leases: tuple[LeaseView, ...]
    notices: tuple[UserNoticeView, ...]
    reclaims: tuple[PastReclaimView, ...]
    withdrawn: tuple[WithdrawnNoticeView, ...]


def user_notices(leases: Iterable[LeaseView]) -> tuple[UserNoticeView, ...]:
    """The reclaim notices of ``leases``, in their order."""
    return tuple(
        UserNoticeView(le.id, le.reclaim.reason, le.reclaim.action, le.reclaim.deadline)
        for le in leases
        if le.reclaim
    )

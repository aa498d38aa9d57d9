"""Borrowed capacity: which leases are borrowed, and which borrowed lease goes back first.

Two rules, each in one place, used by every caller that needs them:

* ``borrowed_flags``: a user's leases, oldest first, are within guarantee while their running
  total fits the user's guarantee, or while the lease's group holds no more than the group's
  guarantee; an administrator's exception is never borrowed; the rest are borrowed. The
  allocator re-derives its flags with it after a release, and ``decide`` of a quota edit runs
  it with the edited guarantee (``pool.rules.quotas.borrowed_if``); the admin panel's preview
  is that decision with its effects discarded, so the preview says what the change will do.
* ``reclaim_order``: when borrowed capacity must go back to someone within guarantee, the lease
  whose owner is most over guarantee goes first, then the idlest (GPU idle the longest; a lease
  not known to be idle counts as idle from now), then the youngest (granted last), then by id
  so the order is total. The reclaim rules (``reclaim._reclaim_borrowed``) and the allocator's
  ``reclaimable_for`` both sort by it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction

from .decisions import Lease
from .quota import QuotaBook


def borrowed_flags(
    leases: Iterable[Lease],
    user_guarantee: Fraction,
    group_guarantee: Callable[[str], Fraction | None],
    group_held: Callable[[str], Fraction],
) -> dict[str, bool]:
    """Lease id → borrowed, for ONE user's ``leases`` (any order).

    ``group_guarantee(group)`` is the group's guarantee (None: the group has no quota);
    ``group_held(group)`` the units the group holds now.
    """
    out: dict[str, bool] = {}
    total = Fraction(0)
    for lease in sorted(leases, key=lambda le: (le.request.arrival, le.id)):
        total += lease.units
        guarantee = group_guarantee(lease.group) if lease.group else None
        within = (
            lease.request.exception  # an administrator's decision, not borrowed
            or total <= user_guarantee
            or (guarantee is not None and group_held(lease.group or "") <= guarantee)
        )
        out[lease.id] = not within
    return out


def reclaim_order(
    surplus: Fraction, idle_since: float | None, granted_at: float, lease_id: str, now: float
) -> tuple[Fraction, float, float, str]:
    """The sort key of a borrowed lease among those that could go back (smallest first).

    ``surplus``: units its owner holds beyond guarantee; ``idle_since``: when its GPU went idle
    (None: not idle, or not known); ``granted_at``: when it was granted.
    """
    return (-surplus, idle_since if idle_since is not None else now, -granted_at, lease_id)


def owner_surplus(
    user: str,
    group: str | None,
    held_user: Mapping[str, Fraction],
    held_group: Mapping[str, Fraction],
    quotas: QuotaBook,
) -> Fraction:
    """Units a lease's owner holds beyond guarantee: the least of the user's and the group's
    surplus (both shrink when the lease goes). ``held_*``: what they hold now (a reclaim
    round passes its own tallies, less the leases already leaving)."""
    surplus = held_user.get(user, Fraction(0)) - quotas.user_spec(user).guarantee
    if group is not None and group in quotas.groups:
        surplus = min(surplus, held_group.get(group, Fraction(0)) - quotas.groups[group].guarantee)
    return surplus

"""The reclaim policies in effect (``GET reclaim/policies`` and the answer of a change): the
section as written, where it comes from, and each offer's resolved policy (``pool``'s own
``ReclaimPolicy``, already a frozen value)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...pool.model import Offer
from ...pool.reclaimpolicy import PolicySet, ReclaimPolicy

__all__ = ["ReclaimPolicyView", "reclaim_policy_view"]


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

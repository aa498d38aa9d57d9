"""A user's JSON (``GET users/{name}``, and what the user page renders)."""

from __future__ import annotations

from typing import Any

from ...store.read.users import UserNoticeView, UserView
from ...timeparse import format_time
from .leases import leases_json
from .quotas import quota_spec_json
from .reclaim import past_reclaim_json, withdrawn_notice_json

__all__ = ["user_json", "user_notice_json"]


def user_notice_json(notice: UserNoticeView) -> dict[str, Any]:
    """A notice as the user reads it (``kind`` ``reclaim``; ``message`` is its reason)."""
    return {
        "lease": notice.lease,
        "kind": "reclaim",
        "message": notice.reason,
        "reason": notice.reason,
        "action": notice.action,
        "deadline": format_time(notice.deadline),
    }


def user_json(user: UserView) -> dict[str, Any]:
    """The user: ``name``, ``groups``, ``quota``, ``held_units``, ``used_unit_hours``, the
    live ``leases``, their ``notices``, recent ``reclaims`` and ``withdrawn`` notices."""
    return {
        "name": user.name,
        "groups": list(user.groups),
        "quota": quota_spec_json(user.quota),
        "held_units": user.held_units,
        "used_unit_hours": user.used_unit_hours,
        "leases": leases_json(user.leases),
        "notices": [user_notice_json(n) for n in user.notices],
        "reclaims": [past_reclaim_json(r) for r in user.reclaims],
        "withdrawn": [withdrawn_notice_json(w) for w in user.withdrawn],
    }

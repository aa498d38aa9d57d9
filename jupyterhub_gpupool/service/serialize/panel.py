"""The admin panel's and the user page's JSON beyond a lease's: the live leases of the lease
table, the units held and queued over time (``GET pool/history``), a user's GPU-hours per day,
the quota table and the quota preview (``POST quotas/{kind}/{name}/preview``)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...store.read.panel import (
    DayUseView,
    LiveLeaseView,
    QuotaEffectView,
    QuotaUseView,
    UnitSeriesView,
)
from ...timeparse import format_time
from .poolmap import preempting_json
from .quotas import quota_json, quota_spec_json

__all__ = [
    "day_uses_json",
    "live_lease_json",
    "quota_effect_json",
    "quota_use_json",
    "unit_series_json",
]


def live_lease_json(lease: LiveLeaseView) -> dict[str, Any]:
    """A live lease of the lease table: ``class`` is its workload; ``age_s`` and ``idle_s``
    are seconds at the time of reading; ``preempting``: its job's preemption notice."""
    notice = lease.notice
    return {
        "id": lease.id,
        "user": lease.user,
        "server": lease.server,
        "offer": lease.offer,
        "state": lease.state,
        "units": lease.units,
        "borrowed": lease.borrowed,
        "node": lease.node,
        "class": lease.workload,
        "job": lease.job,
        "since": format_time(lease.since),
        "age_s": lease.age_s,
        "idle_s": lease.idle_s,
        "notice": None
        if notice is None
        else {
            "kind": notice.kind,
            "deadline": format_time(notice.deadline),
            "reason": notice.reason,
            "acting": notice.acting,
        },
        "preempting": preempting_json(lease.preempting),
    }


def unit_series_json(series: UnitSeriesView) -> dict[str, Any]:
    """The ``used`` and ``queued`` members of ``GET pool/history``."""
    return {"used": list(series.used), "queued": list(series.queued)}


def day_uses_json(days: Iterable[DayUseView]) -> list[dict[str, Any]]:
    """A user's days, oldest first: the day (``YYYY-MM-DD``) and unit-hours held and busy."""
    return [{"day": d.day.isoformat(), "held": d.held, "busy": d.busy} for d in days]


def quota_use_json(row: QuotaUseView) -> dict[str, Any]:
    """A row of the quota table: the quota (``quota_json``) with ``held`` and
    ``borrowed_units`` now."""
    return {**quota_json(row.quota), "held": row.held, "borrowed_units": row.borrowed_units}


def quota_effect_json(effect: QuotaEffectView) -> dict[str, Any]:
    """The quota preview's answer."""
    return {
        "kind": effect.kind,
        "name": effect.name,
        "quota": quota_spec_json(effect.quota),
        "held": effect.held,
        "become_borrowed": list(effect.become_borrowed),
        "become_within": list(effect.become_within),
        "over_limit_by": effect.over_limit_by,
    }

"""A budget warning as the budget round answers it: ``BudgetWarningView`` (whose budget, the
level crossed, the unit-hours used against the budget, the period and its start), built by
``budget_warning_view`` from the warning ``pool.decide`` made (also the ``budget-warning``
audit event's data). The period's start is the naive UTC ``datetime`` it began. A view is
frozen and pickles (it crosses the writer process's pipe).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any


@dataclass(frozen=True)
class BudgetWarningView:
    """A user's or group's (``subject``) budget use crossed ``level`` % this period:
    ``used_unit_hours`` of ``budget``, the period (``day``, ``week``...) and when it began, and
    what a spent budget does (``action``: ``refuse``, ``notify`` or ``stop``)."""

    subject: str
    name: str
    level: int
    used_unit_hours: float
    budget: float
    period: str
    period_start: datetime
    action: str


def budget_warning_view(warning: Mapping[str, Any]) -> BudgetWarningView:
    """The warning ``pool.decide`` answered (its ``period_start``: an aware UTC
    ``datetime``)."""
    start: datetime = warning["period_start"]
    return BudgetWarningView(
        subject=str(warning["subject"]),
        name=str(warning["name"]),
        level=int(warning["level"]),
        used_unit_hours=float(warning["used_unit_hours"]),
        budget=float(warning["budget"]),
        period=str(warning["period"]),
        period_start=start.astimezone(timezone.utc).replace(tzinfo=None),
        action=str(warning["action"]),
    )

"""A budget warning's JSON (``BudgetWarningView``): what the notify hook is given, as the
``budget-warning`` audit event records it."""

from __future__ import annotations

from typing import Any

from ...store.read.budgets import BudgetWarningView
from ...timeparse import format_time


def budget_warning_json(view: BudgetWarningView) -> dict[str, Any]:
    """The warning's fields, ``period_start`` as ISO 8601 UTC text."""
    return {
        "subject": view.subject,
        "name": view.name,
        "level": view.level,
        "used_unit_hours": view.used_unit_hours,
        "budget": view.budget,
        "period": view.period,
        "period_start": format_time(view.period_start),
        "action": view.action,
    }

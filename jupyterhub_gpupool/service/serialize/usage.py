"""The usage report's JSON (``UsageReportView``: the API's ``GET usage``, its CSV download, the
admin panel's usage page and the ``jupyterhub-gpupool report`` file) and the idle holders'
(``IdleHolderView``: ``GET usage/idle-holders``). Unit-hours are JSON numbers, costs and prices
strings (exact, to the cent)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ...store.read.usage import (
    IdleHolderView,
    PriceUsedView,
    UsageFigures,
    UsageReportView,
    UsageRowView,
)
from ...timeparse import format_time


def usage_figures_json(figures: UsageFigures) -> dict[str, Any]:
    """A row's or the total's figures, in the CSV's column order (``pool.pricing``)."""
    return {
        "leases": figures.leases,
        "held_unit_hours": float(figures.held),
        "busy_unit_hours": float(figures.busy),
        "estimated_busy_unit_hours": float(figures.estimated),
        "idle_unit_hours": float(figures.idle),
        "idle_share": figures.idle_share,
        "unpriced_unit_hours": float(figures.unpriced),
        "cost": str(figures.cost),
    }


def usage_row_json(row: UsageRowView, by: str) -> dict[str, Any]:
    """A row grouped ``by``: its key under the grouping's name, its kind, its figures and, by
    job, the job's name."""
    out: dict[str, Any] = {by: row.key, "kind": row.kind, **usage_figures_json(row.figures)}
    if row.name is not None:
        out["name"] = row.name
    return out


def usage_rows_json(rows: Iterable[UsageRowView], by: str) -> list[dict[str, Any]]:
    """Rows grouped ``by`` (the CSV's and the charts' rows)."""
    return [usage_row_json(r, by) for r in rows]


def price_used_json(price: PriceUsedView) -> dict[str, Any]:
    """A price used: ``from`` None where it was in force since always."""
    return {
        "model": price.model,
        "from": format_time(price.since),
        "held": str(price.held),
        "busy": str(price.busy),
    }


def usage_report_json(view: UsageReportView) -> dict[str, Any]:
    """The body of ``GET usage``: the range, the grouping, the currency, the rows, their
    total and the prices used."""
    return {
        "from": format_time(view.start),
        "to": format_time(view.end),
        "by": view.by,
        "currency": view.currency,
        "items": usage_rows_json(view.items, view.by),
        "total": usage_figures_json(view.total),
        "prices": [price_used_json(p) for p in view.prices],
    }


def idle_holder_json(view: IdleHolderView) -> dict[str, Any]:
    """An idle holder: the idle cost a string, to the cent."""
    return {
        "user": view.user,
        "leases": view.leases,
        "held_unit_hours": float(view.held),
        "busy_unit_hours": float(view.busy),
        "idle_unit_hours": float(view.idle),
        "idle_share": view.idle_share,
        "idle_cost": str(view.idle_cost),
    }


def idle_holders_json(views: Iterable[IdleHolderView]) -> list[dict[str, Any]]:
    """The idle holders, most idle first (the items of ``GET usage/idle-holders``)."""
    return [idle_holder_json(v) for v in views]

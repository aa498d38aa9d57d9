"""The admin panel's governance pages: usage and cost (chargeback), recorded capacity, and the
what-if replay. Each page needs ``custom:gpupool:admin`` (``AdminPage``).

The usage and capacity pages are rendered from the very store calls the API answers with
(``usage_report``, ``idle_holders``, ``capacity``), serialized as the API serializes them
(``service/serialize/usage.py``, ``planning.py``), so the tables show the API's figures for the
same range; their charts draw the same rows (a JSON ``data-`` attribute, read by the page's
script). The CSV download and the what-if replay are REST API calls from the script (with the
hub's XSRF token): ``GET usage?format=csv`` and ``POST capacity/what-if``.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlencode

from tornado import web

from ...pool.errors import PoolError
from ..apihandlers.base import time_field
from ..serialize.planning import capacity_json
from ..serialize.usage import idle_holders_json, usage_report_json
from .admin import AdminPage

#: How the usage page may group its rows (the API's ``by``).
GROUPINGS = ("group", "user", "offer")
#: Top idle holders shown.
IDLE_HOLDERS = 10
#: The capacity page's default range, in days back from today.
CAPACITY_DAYS = 30


def month_of(now: datetime) -> tuple[datetime, datetime]:
    """The calendar month (UTC) holding ``now``: its first day and the next month's."""
    first = datetime(now.year, now.month, 1)
    nxt = datetime(now.year + (now.month == 12), now.month % 12 + 1, 1)
    return first, nxt


def day_text(moment: datetime) -> str:
    """A bound as the form's date or date-time input shows it."""
    if moment == datetime(moment.year, moment.month, moment.day):
        return moment.date().isoformat()
    return moment.isoformat(timespec="minutes")


class RangePage(AdminPage):
    """An admin page over a time range ``from`` (included) to ``to`` (excluded)."""

    def time_range(self, start: datetime, end: datetime) -> tuple[datetime, datetime, str | None]:
        """The ``from`` and ``to`` arguments (defaults: ``start``, ``end``) and, for one that
        is no time, the error the page shows naming it (its default is used instead)."""
        error = None
        raw = {k: self.get_argument(k, "").strip() for k in ("from", "to")}
        try:
            if raw["from"]:
                start = time_field(raw["from"], "from")
            if raw["to"]:
                end = time_field(raw["to"], "to")
        except PoolError as e:
            error = f"{e.field}: {e.message}"
        return start, end, error


class UsagePage(RangePage):
    """``GET admin/usage?from=&to=&by=group|user|offer``: unit-hours held vs busy and their cost
    per row over the range (the current month by default), with the total, the CSV download
    (``GET usage?format=csv``, to the cent the same) and the top idle holders."""

    @web.authenticated
    def get(self) -> None:
        start, end = month_of(self.store.clock())
        start, end, error = self.time_range(start, end)
        by = self.get_argument("by", "group")
        if by not in GROUPINGS:
            error, by = f"by: cannot group usage by {by!r} (group, user or offer)", "group"
        report: dict[str, Any] = {"currency": self.store.prices.currency, "items": []}
        holders: list[dict[str, Any]] = []
        try:
            report = usage_report_json(self.store.usage_report(start, end, by))
            holders = idle_holders_json(self.store.idle_holders(start, end, IDLE_HOLDERS))
        except PoolError as e:  # 'to' not after 'from': said above the form's table
            error = f"{e.field}: {e.message}" if e.field else e.message
        query = {"from": start.isoformat() + "Z", "to": end.isoformat() + "Z", "by": by}
        self.render_page(
            "admin_usage.html",
            title="Usage and cost",
            by=by,
            groupings=GROUPINGS,
            start=day_text(start),
            end=day_text(end),
            report=report,
            total=report.get("total"),
            holders=holders,
            error=error,
            csv_query=urlencode({**query, "format": "csv"}),
            usage_json=json.dumps(report["items"]),
            price_table=self.store.prices.to_json(),
        )


class CapacityPage(RangePage):
    """``GET admin/capacity?from=&to=&offer=``: per offer and day, demand, waits (p50/p95),
    idle share and the requests that waited for quota or for capacity (the last 30 days by
    default)."""

    @web.authenticated
    def get(self) -> None:
        now = self.store.clock()
        today = datetime(now.year, now.month, now.day)
        start, end, error = self.time_range(
            today - timedelta(days=CAPACITY_DAYS - 1), today + timedelta(days=1)
        )
        offers = self.offers()
        offer = self.get_argument("offer", "").strip() or None
        items: list[dict[str, Any]] = []
        try:
            items = capacity_json(self.store.capacity(start, end, offer))
        except PoolError as e:
            error = f"{e.field}: {e.message}" if e.field else e.message
        self.render_page(
            "admin_capacity.html",
            title="Capacity",
            start=day_text(start),
            end=day_text(end),
            offer=offer or "",
            offers=offers,
            items=items,
            error=error,
            capacity_json=json.dumps(items),
        )


class WhatIfPage(AdminPage):
    """``GET admin/what-if``: the replay's form (days back, GPUs added, nodes removed, MIG
    layouts, a reclaim policy); the script posts it to ``capacity/what-if`` and shows the
    recorded and the replayed figures side by side, or the API's refusal beside its field."""

    @web.authenticated
    def get(self) -> None:
        clusters = self.store.pool(detail=True).clusters or ()
        nodes = sorted(n.name for c in clusters for n in c.nodes)
        first = self.store.first_request()
        recorded, unit, span = recorded_words(first, self.store.clock())
        self.render_page(
            "admin_whatif.html",
            title="What-if",
            models=list(self.store.catalog.names),
            nodes=nodes,
            recorded=recorded,
            default_unit=unit,
            default_span=span,
            offers_json=json.dumps(self.offers()),
        )


def recorded_words(first: datetime | None, now: datetime) -> tuple[str, str, int]:
    """What the what-if page says the database holds, in words, and the span its form starts
    with (unit, count): up to 30 days where there are whole days, else the hours there are."""
    if first is None:
        return (
            "No request has been recorded yet: the replay needs at least one hour of recorded "
            "requests.",
            "hours",
            1,
        )
    days = (now - datetime(first.year, first.month, first.day)).days
    if days >= 1:
        words = f"{days} day{'s' if days != 1 else ''}"
        return (
            f"The database holds {words} of requests, since {first.date()}.",
            "days",
            min(30, days),
        )
    hours = int((now - first) // timedelta(hours=1))
    since = first.strftime("%Y-%m-%d %H:%M UTC")
    if hours >= 1:
        words = f"{hours} hour{'s' if hours != 1 else ''}"
        return f"The database holds {words} of requests, since {since}.", "hours", hours
    ready = (first + timedelta(hours=1)).strftime("%H:%M UTC")
    return (
        f"The database holds less than an hour of requests (since {since}); the replay needs "
        f"at least one hour of them: ask after {ready}.",
        "hours",
        1,
    )

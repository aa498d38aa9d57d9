"""Chargeback: unit-hours held and busy per user, group or offer with their cost, the top idle
holders, and the totals that the usage API, its CSV and the monthly report share.

Every figure comes from one pass over the leases held within the range (``usage_rows``), and
every cost follows ``pool.pricing``'s one rounding rule, so the API, the CSV download and the
``jupyterhub-gpupool report`` file agree to the cent.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import or_, select

from .. import orm
from ..pool.pricing import USAGE_COLUMNS, Prices, cents, to_hours
from .errors import StoreError
from .rows import held_hours
from .views import ViewStore

BY = ("user", "group", "offer")
#: The columns of a usage row, in the CSV's order after the key column.
COLUMNS = USAGE_COLUMNS


def lease_figures(
    row: orm.LeaseRow, start: datetime, end: datetime, now: datetime
) -> tuple[Decimal, Decimal]:
    """Unit-hours ``row`` was held and busy within [start, end) (six decimals each).

    Busy hours are recorded per lease, not per minute: the range gets the share of them that
    its held time is of the whole lease's held time.
    """
    held = held_hours(row, start, min(end, now))
    span = held_hours(row, row.granted, row.released or now) if row.granted else 0.0
    busy = row.busy_hours * (held / span) * row.units_f if span else 0.0
    h = to_hours(held)
    return h, min(h, to_hours(busy))


def aggregate(
    rows: Iterable[orm.LeaseRow],
    start: datetime,
    end: datetime,
    now: datetime,
    by: str,
    prices: Prices,
) -> list[dict[str, Any]]:
    """One row per key of ``by``: leases, unit-hours held, busy and idle, the idle share, the
    unit-hours of unpriced models and the cost (a string, to the cent), sorted by key."""
    acc: dict[str, dict[str, Any]] = {}
    for row in rows:
        key = getattr(row, by) or ""
        held, busy = lease_figures(row, start, end, now)
        a = acc.setdefault(
            key,
            {by: key, "leases": 0, "held": Decimal(0), "busy": Decimal(0)}
            | {"unpriced": Decimal(0), "exact": Decimal(0)},
        )
        a["leases"] += 1
        a["held"] += held
        a["busy"] += busy
        cost = prices.cost(row.model, held, busy)
        if cost is None:
            a["unpriced"] += held
        else:
            a["exact"] += cost
    out = []
    for key in sorted(acc):
        a = acc[key]
        held, busy = a["held"], a["busy"]
        out.append(
            {
                by: key,
                "leases": a["leases"],
                "held_unit_hours": float(held),
                "busy_unit_hours": float(busy),
                "idle_unit_hours": float(held - busy),
                "idle_share": round(float((held - busy) / held), 4) if held else 0.0,
                "unpriced_unit_hours": float(a["unpriced"]),
                "cost": str(cents(a["exact"])),
            }
        )
    return out


def totals(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The totals of usage rows: the cost is the sum of the rows' (rounded) costs."""
    held = sum((to_hours(r["held_unit_hours"]) for r in items), Decimal(0))
    busy = sum((to_hours(r["busy_unit_hours"]) for r in items), Decimal(0))
    return {
        "leases": sum(r["leases"] for r in items),
        "held_unit_hours": float(held),
        "busy_unit_hours": float(busy),
        "idle_unit_hours": float(held - busy),
        "idle_share": round(float((held - busy) / held), 4) if held else 0.0,
        "unpriced_unit_hours": float(
            sum((to_hours(r["unpriced_unit_hours"]) for r in items), Decimal(0))
        ),
        "cost": str(sum((Decimal(r["cost"]) for r in items), Decimal("0.00"))),
    }


class ChargebackStore(ViewStore):
    """The usage report with costs, and who holds GPUs idle."""

    def _usage_leases(self, start: datetime, end: datetime) -> list[orm.LeaseRow]:
        if end <= start:
            raise StoreError("invalid_range", "'to' must be after 'from'", field="to")
        with self.read() as db:
            return list(
                db.scalars(
                    select(orm.LeaseRow).where(
                        orm.LeaseRow.granted.is_not(None),
                        orm.LeaseRow.granted < end,
                        or_(orm.LeaseRow.released.is_(None), orm.LeaseRow.released > start),
                    )
                )
            )

    @property
    def prices(self) -> Prices:
        """The prices of the pool config file."""
        return self.file_config.prices

    def usage(self, start: datetime, end: datetime, by: str) -> list[dict[str, Any]]:
        """Unit-hours held, busy and idle, and their cost, per user, group or offer within
        [start, end)."""
        if by not in BY:
            raise StoreError(
                "invalid_by", f"cannot group usage by {by!r}", field="by", allowed=list(BY)
            )
        rows = self._usage_leases(start, end)
        return aggregate(rows, start, end, self.clock(), by, self.prices)

    def usage_report(self, start: datetime, end: datetime, by: str) -> dict[str, Any]:
        """``usage`` with its totals and the currency (the API's JSON body, less the range)."""
        items = self.usage(start, end, by)
        return {"currency": self.prices.currency, "items": items, "total": totals(items)}

    def idle_holders(self, start: datetime, end: datetime, limit: int = 10) -> list[dict[str, Any]]:
        """The users who held the most unit-hours idle within [start, end), most first: held,
        busy and idle unit-hours, the idle share and what the idle hours cost at the held
        price."""
        rows = self._usage_leases(start, end)
        now = self.clock()
        acc: dict[str, dict[str, Any]] = {}
        for row in rows:
            held, busy = lease_figures(row, start, end, now)
            a = acc.setdefault(
                row.user,
                {"held": Decimal(0), "busy": Decimal(0), "idle_cost": Decimal(0), "leases": 0},
            )
            a["held"] += held
            a["busy"] += busy
            a["leases"] += 1
            price = self.prices.models.get(row.model or "")
            if price is not None:
                a["idle_cost"] += (held - busy) * price.held
        ranked = sorted(acc.items(), key=lambda kv: (-(kv[1]["held"] - kv[1]["busy"]), kv[0]))
        return [
            {
                "user": user,
                "leases": a["leases"],
                "held_unit_hours": float(a["held"]),
                "busy_unit_hours": float(a["busy"]),
                "idle_unit_hours": float(a["held"] - a["busy"]),
                "idle_share": round(float((a["held"] - a["busy"]) / a["held"]), 4)
                if a["held"]
                else 0.0,
                "idle_cost": str(cents(a["idle_cost"])),
            }
            for user, a in ranked[:limit]
            if a["held"] > a["busy"]
        ]

"""Chargeback: unit-hours held and busy per user, group or offer with their cost, the top idle
holders, and the totals that the usage API, its CSV and the monthly report share.

Every figure comes from one pass over the leases held within the range (``usage_rows``), and
every cost follows ``pool.pricing``'s one rounding rule, so the API, the CSV download and the
``jupyterhub-gpupool report`` file agree to the cent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import or_, select

from .. import orm
from ..pool.kernels import KERNEL_HOLDER
from ..pool.pricing import ALWAYS, USAGE_COLUMNS, Prices, cents
from ..pool.usage import BusyTime, LineItem, line_item
from ..pool.workloads import JOB_HOLDER
from .errors import StoreError
from .rows import schedules
from .usagefacts import BusyTimeStore, span_of

BY = ("user", "group", "offer", "job", "kernel")
#: The row of leases charged to no group (named in every format, never an empty key).
NO_GROUP = "(no group)"
#: Grouped by job: the row of every lease no job holds (the servers'), kind ``no-job``.
NO_JOB = "(servers)"
#: Grouped by kernel: the row of every lease no GPU kernel holds, kind ``no-kernel``.
NO_KERNEL = "(not kernels)"
#: The columns of a usage row, in the CSV's order after the key column.
COLUMNS = USAGE_COLUMNS


def lease_figures(
    row: Any,
    busy: Mapping[datetime, BusyTime],
    start: datetime,
    end: datetime,
    now: datetime,
) -> tuple[Decimal, Decimal]:
    """Unit-hours ``row`` was held and busy within [start, end) (six decimals each), from its
    busy time per hour (``pool.usage.line_item``, unpriced)."""
    item = line_item(span_of(row), busy, start, end, now, lambda _m, _h: None)
    return item.held, item.busy


def aggregate(lines: Iterable[tuple[orm.LeaseRow, LineItem]], by: str) -> list[dict[str, Any]]:
    """One row per key of ``by``: the sums of its line items (leases, unit-hours held, busy,
    estimated and idle, unpriced, cost), sorted by key; leases charged to no group are the row
    ``(no group)`` of kind ``no-group``, after the named ones."""
    acc: dict[tuple[bool, str], dict[str, Any]] = {}
    for row, item in lines:
        key = key_of(row, by)
        a = acc.setdefault(key, {"leases": 0} | {k: Decimal(0) for k in _SUMS})
        a["leases"] += 1
        a["held"] += item.held
        a["busy"] += item.busy
        a["estimated"] += item.estimated
        a["unpriced"] += item.unpriced
        a["cost"] += item.cost
    return [
        {by: name, "kind": f"no-{by}" if none else by, **_figures(acc[(none, name)])}
        for none, name in sorted(acc)
    ]


_SUMS = ("held", "busy", "estimated", "unpriced", "cost")


def key_of(row: orm.LeaseRow, by: str) -> tuple[bool, str]:
    """The row a lease falls in for grouping ``by``: (no group?, name); no group is named
    :data:`NO_GROUP` (a group of that very name stays apart: its kind is ``group``). By job:
    each job lease its own row (``job:<id>``, its ``server``), every other lease :data:`NO_JOB`."""
    if by == "job":
        return (False, row.server) if row.holder == JOB_HOLDER else (True, NO_JOB)
    if by == "kernel":  # each GPU kernel its own row (``kernel:<id>``)
        return (False, row.server) if row.holder == KERNEL_HOLDER else (True, NO_KERNEL)
    value = getattr(row, by)
    return (False, value) if value else (True, NO_GROUP)


def _figures(a: Mapping[str, Any]) -> dict[str, Any]:
    held, busy = a["held"], a["busy"]
    return {
        "leases": a["leases"],
        "held_unit_hours": float(held),
        "busy_unit_hours": float(busy),
        "estimated_busy_unit_hours": float(a["estimated"]),
        "idle_unit_hours": float(held - busy),
        "idle_share": round(float((held - busy) / held), 4) if held else 0.0,
        "unpriced_unit_hours": float(a["unpriced"]),
        "cost": str(cents(a["cost"])),
    }


def totals(items: list[dict[str, Any]]) -> dict[str, Any]:
    """The totals of usage rows: every figure is the sum of the rows' figures as shown."""
    acc: dict[str, Any] = {"leases": sum(r["leases"] for r in items)}
    for k, col in zip(_SUMS, _COLS, strict=True):
        acc[k] = sum((Decimal(str(r[col])) for r in items), Decimal(0))
    return _figures(acc)


def prices_used(items: Iterable[LineItem]) -> list[dict[str, str | None]]:
    """Each price the line items were priced at: model, when it took effect (None: since
    always), held and busy prices (strings: exact), by model then start."""
    seen = {(m, t): p for item in items for m, t, p in item.prices}
    return [
        {
            "model": m,
            "from": None if t == ALWAYS else t.isoformat() + "Z",
            "held": str(p.held),
            "busy": str(p.busy),
        }
        for (m, t), p in sorted(seen.items())
    ]


_COLS = (
    "held_unit_hours",
    "busy_unit_hours",
    "estimated_busy_unit_hours",
    "unpriced_unit_hours",
    "cost",
)


class ChargebackStore(BusyTimeStore):
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

    def line_items(self, start: datetime, end: datetime) -> list[tuple[orm.LeaseRow, LineItem]]:
        """Every lease held within [start, end) with its line item (``pool.usage``)."""
        rows = self._usage_leases(start, end)
        busy = self.busy_time((r.id for r in rows), start, end)
        now, prices = self.clock(), self.prices
        price_at = prices.price_at
        return [
            (r, line_item(span_of(r), busy.get(r.id, {}), start, end, now, price_at)) for r in rows
        ]

    @property
    def prices(self) -> Prices:
        """The price table over time as recorded (``load_config``); the pool config file's
        prices where none is recorded (a report on a database the service never priced)."""
        with self.read() as db:
            rows = list(db.scalars(select(orm.PriceRow)))
        if not rows:
            return self.file_config.prices
        return Prices(rows[0].currency, schedule=schedules(rows))

    def usage(self, start: datetime, end: datetime, by: str) -> list[dict[str, Any]]:
        """Unit-hours held, busy and idle, and their cost, per user, group or offer within
        [start, end)."""
        return list(self.usage_report(start, end, by)["items"])

    def usage_report(self, start: datetime, end: datetime, by: str) -> dict[str, Any]:
        """``usage`` with its totals, the currency and the prices used (the API's JSON body,
        less the range)."""
        if by not in BY:
            raise StoreError(
                "invalid_by", f"cannot group usage by {by!r}", field="by", allowed=list(BY)
            )
        lines = self.line_items(start, end)
        items = aggregate(lines, by)
        if by == "job":  # people read the job's name beside its id
            names = self._job_names(item["job"] for item in items if item["kind"] == "job")
            for item in items:
                item["name"] = names.get(item["job"], "")
        return {
            "currency": self.prices.currency,
            "items": items,
            "total": totals(items),
            "prices": prices_used(item for _, item in lines),
        }

    def _job_names(self, servers: Iterable[str]) -> dict[str, str]:
        """``job:<id>`` → the job's name."""
        ids = {server.removeprefix("job:"): server for server in servers}
        if not ids:
            return {}
        with self.read() as db:
            rows = db.execute(
                select(orm.JobRow.id, orm.JobRow.name).where(orm.JobRow.id.in_(list(ids)))
            )
            return {ids[i]: name for i, name in rows}

    def idle_holders(self, start: datetime, end: datetime, limit: int = 10) -> list[dict[str, Any]]:
        """The users who held the most unit-hours idle within [start, end), most first: held,
        busy and idle unit-hours, the idle share and what the idle hours cost at the held
        price (each lease's idle cost rounded once, as its line item)."""
        acc: dict[str, dict[str, Any]] = {}
        for row, item in self.line_items(start, end):
            a = acc.setdefault(
                row.user,
                {"held": Decimal(0), "busy": Decimal(0), "idle_cost": Decimal(0), "leases": 0},
            )
            a["held"] += item.held
            a["busy"] += item.busy
            a["leases"] += 1
            a["idle_cost"] += item.idle_cost
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

"""Chargeback: unit-hours held and busy per user, group or offer with their cost, the top idle
holders, and the totals that the usage API, its CSV and the monthly report share.

Every figure comes from one pass over the leases held within the range (``line_items``) and
is built into a read model (``store/read/usage.py``); every cost follows ``pool.pricing``'s
one rounding rule, so the API, the CSV download and the ``jupyterhub-gpupool report`` file
agree to the cent.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from decimal import Decimal
from typing import Any

from sqlalchemy import or_, select

from .. import orm
from ..pool.pricing import USAGE_COLUMNS, Prices
from ..pool.usage import BusyTime, LineItem, line_item
from .errors import StoreError
from .read.usage import (
    IdleHolderView,
    UsageReportView,
    UsageRowView,
    idle_holders,
    key_of,
    usage_report_view,
)
from .rows import schedules
from .usagefacts import BusyTimeStore, span_of

BY = ("user", "group", "offer", "job", "kernel")
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

    def usage(self, start: datetime, end: datetime, by: str) -> tuple[UsageRowView, ...]:
        """Unit-hours held, busy and idle, and their cost, per user, group or offer within
        [start, end)."""
        return self.usage_report(start, end, by).items

    def usage_report(self, start: datetime, end: datetime, by: str) -> UsageReportView:
        """``usage`` with its totals, the currency and the prices used (the API's body)."""
        if by not in BY:
            raise StoreError(
                "invalid_by", f"cannot group usage by {by!r}", field="by", allowed=list(BY)
            )
        lines = self.line_items(start, end)
        names = None
        if by == "job":  # people read the job's name beside its id
            names = self._job_names(
                key for none, key in (key_of(row, by) for row, _ in lines) if not none
            )
        currency = self.prices.currency
        return usage_report_view(lines, start=start, end=end, by=by, currency=currency, names=names)

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

    def idle_holders(
        self, start: datetime, end: datetime, limit: int = 10
    ) -> tuple[IdleHolderView, ...]:
        """The users who held the most unit-hours idle within [start, end), most first: held,
        busy and idle unit-hours and what the idle hours cost at the held price (each lease's
        idle cost rounded once, as its line item)."""
        return idle_holders(self.line_items(start, end), limit)

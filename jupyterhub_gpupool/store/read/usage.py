"""Usage and cost as the chargeback shows them: ``UsageReportView`` (one row per user, group,
offer, job or kernel with its totals and the prices used) and ``IdleHolderView`` (who held
GPUs idle), built by plain functions from the leases' line items (``pool.usage.line_item``).

Unit-hours stay the line items' exact six-decimal ``Decimal`` and costs ``Decimal`` to the cent
(``pool.pricing.cents``), so a bill is the same to the cent wherever it is written; the
serializer (``service/serialize/usage.py``) chooses the wire names and number types. A view is
frozen and pickles (it crosses the writer process's pipe).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from ... import orm
from ...pool.kernels import KERNEL_HOLDER
from ...pool.pricing import ALWAYS, cents
from ...pool.usage import LineItem
from ...pool.workloads import JOB_HOLDER

#: The row of leases charged to no group (named in every format, never an empty key).
NO_GROUP = "(no group)"
#: Grouped by job: the row of every lease no job holds (the servers'), kind ``no-job``.
NO_JOB = "(servers)"
#: Grouped by kernel: the row of every lease no GPU kernel holds, kind ``no-kernel``.
NO_KERNEL = "(not kernels)"


@dataclass(frozen=True)
class UsageFigures:
    """The sums of some line items: leases, unit-hours held, busy (of which ``estimated``)
    and not priced, and the cost to the cent."""

    leases: int
    held: Decimal
    busy: Decimal
    estimated: Decimal
    unpriced: Decimal
    cost: Decimal

    @property
    def idle(self) -> Decimal:
        """Unit-hours held but not busy."""
        return self.held - self.busy

    @property
    def idle_share(self) -> float:
        """The idle share of the held unit-hours, to four decimals (0 when nothing was held)."""
        return round(float(self.idle / self.held), 4) if self.held else 0.0


@dataclass(frozen=True)
class UsageRowView:
    """One row of a usage report: its ``key`` (the user, group, offer, ``job:<id>`` or
    ``kernel:<id>``; :data:`NO_GROUP`, :data:`NO_JOB` or :data:`NO_KERNEL` for the leases of
    none), its ``kind`` (the grouping, or ``no-<grouping>``), its figures and, grouped by
    job, the job's ``name`` (``""`` where unknown; None for the other groupings)."""

    key: str
    kind: str
    figures: UsageFigures
    name: str | None = None


@dataclass(frozen=True)
class PriceUsedView:
    """A price the line items were priced at: a model's held and busy prices per unit-hour
    in force ``since`` (None: since always)."""

    model: str
    since: datetime | None
    held: Decimal
    busy: Decimal


@dataclass(frozen=True)
class UsageReportView:
    """Usage within [start, end) grouped ``by``: the rows by key (the leases of none last),
    their totals (the sums of the rows as shown), the currency and the prices used."""

    start: datetime
    end: datetime
    by: str
    currency: str
    items: tuple[UsageRowView, ...]
    total: UsageFigures
    prices: tuple[PriceUsedView, ...]


@dataclass(frozen=True)
class IdleHolderView:
    """A user who held unit-hours idle: the leases, unit-hours held and busy, and what the
    idle hours cost at the held price (each lease's rounded once, as its line item)."""

    user: str
    leases: int
    held: Decimal
    busy: Decimal
    idle_cost: Decimal

    @property
    def idle(self) -> Decimal:
        """Unit-hours held but not busy."""
        return self.held - self.busy

    @property
    def idle_share(self) -> float:
        """The idle share of the held unit-hours, to four decimals."""
        return round(float(self.idle / self.held), 4) if self.held else 0.0


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


def figures_of(items: Iterable[LineItem]) -> UsageFigures:
    """The sums of line items (the cost rounded to the cent once more: a no-op on sums of
    rounded costs)."""
    leases, held, busy, estimated, unpriced, cost = 0, *(Decimal(0),) * 5
    for item in items:
        leases += 1
        held += item.held
        busy += item.busy
        estimated += item.estimated
        unpriced += item.unpriced
        cost += item.cost
    return UsageFigures(leases, held, busy, estimated, unpriced, cents(cost))


def aggregate(
    lines: Iterable[tuple[orm.LeaseRow, LineItem]],
    by: str,
    names: Mapping[str, str] | None = None,
) -> tuple[UsageRowView, ...]:
    """One row per key of ``by`` (``key_of``) with the sums of its line items, sorted by key;
    the leases of none (kind ``no-<by>``) after the named ones. ``names``: grouped by job, a
    job's name by its key (every row of the grouping gets one, ``""`` where unknown)."""
    acc: dict[tuple[bool, str], list[LineItem]] = {}
    for row, item in lines:
        acc.setdefault(key_of(row, by), []).append(item)
    return tuple(
        UsageRowView(
            name,
            f"no-{by}" if none else by,
            figures_of(acc[(none, name)]),
            None if names is None else names.get(name, ""),
        )
        for none, name in sorted(acc)
    )


def shown(value: Decimal) -> Decimal:
    """A unit-hour figure as the usage report shows it (a JSON number: the shortest decimal
    that reads back as the same float), so a total adds up what a reader sees."""
    return Decimal(str(float(value)))


def totals(rows: Iterable[UsageRowView]) -> UsageFigures:
    """The totals of usage rows: each figure the sum of the rows' figures as shown (the cost:
    of the rows' costs to the cent)."""
    figures = [r.figures for r in rows]
    zero = Decimal(0)
    return UsageFigures(
        sum(f.leases for f in figures),
        sum((shown(f.held) for f in figures), zero),
        sum((shown(f.busy) for f in figures), zero),
        sum((shown(f.estimated) for f in figures), zero),
        sum((shown(f.unpriced) for f in figures), zero),
        cents(sum((f.cost for f in figures), zero)),
    )


def prices_used(items: Iterable[LineItem]) -> tuple[PriceUsedView, ...]:
    """Each price the line items were priced at, by model then start."""
    seen = {(m, t): p for item in items for m, t, p in item.prices}
    return tuple(
        PriceUsedView(m, None if t == ALWAYS else t, p.held, p.busy)
        for (m, t), p in sorted(seen.items())
    )


def usage_report_view(
    lines: list[tuple[orm.LeaseRow, LineItem]],
    *,
    start: datetime,
    end: datetime,
    by: str,
    currency: str,
    names: Mapping[str, str] | None = None,
) -> UsageReportView:
    """The usage report of ``lines`` (every lease held within [start, end) with its line
    item) grouped ``by``; ``names``: grouped by job, the jobs' names (``aggregate``)."""
    items = aggregate(lines, by, names)
    return UsageReportView(
        start, end, by, currency, items, totals(items), prices_used(item for _, item in lines)
    )


def idle_holders(
    lines: Iterable[tuple[orm.LeaseRow, LineItem]], limit: int
) -> tuple[IdleHolderView, ...]:
    """The ``limit`` users who held the most unit-hours idle, most first (then by name); a
    user with no idle hours is not listed."""
    acc: dict[str, list[LineItem]] = {}
    for row, item in lines:
        acc.setdefault(row.user, []).append(item)
    views = [
        IdleHolderView(
            user,
            len(items),
            sum((i.held for i in items), Decimal(0)),
            sum((i.busy for i in items), Decimal(0)),
            cents(sum((i.idle_cost for i in items), Decimal(0))),
        )
        for user, items in acc.items()
    ]
    ranked = sorted(views, key=lambda v: (-v.idle, v.user))
    return tuple(v for v in ranked[:limit] if v.held > v.busy)

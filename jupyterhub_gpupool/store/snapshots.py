"""Leases a batch releases, read as plain values instead of ORM rows (PostgreSQL).

A batch loads the leases its releases address in one query (``StoreCore.run_batch``). Through
the ORM that query (a joined load of each lease and its slots, and an identity-mapped instance
with instrumented attributes per row) was a fifth of the store process's CPU under load, and a
release then only reads the row, marks it released (``bulk.queue_release``, written by a Core
statement at the end) and answers its JSON. Here the same columns come back from the driver,
in the pipeline that starts the batch (``core.begin_batch``), as a ``LeaseSnapshot`` with the
ORM row's attribute names, which ``release`` reads and marks the same way.

Only where nothing else in the batch can see the lease as a row: a batch of ``allocate`` and
``release`` calls alone (``expire_grants`` and ``promote`` load leases by state; ``keepalive``
and ``resize`` load the rows they address, and a bind loads its resize's old lease) in which each
released lease is addressed once, and only a lease a release just ends: granted or active, no
reclaim under way (its notice is part of the answer; the reclaimer's own stop rewrites the
reason), no MIG instance the pool made for it (retiring that writes the GPU's rows). Any other
lease of the batch is loaded through the ORM as before.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any

from sqlalchemy import inspect as inspect_mapped
from sqlalchemy.dialects import postgresql
from sqlalchemy.sql.elements import NamedColumn

from .. import orm
from ..pool import commands
from .rows import table_of

#: The calls a batch may hold for its releases to read snapshots.
_SIMPLE = (commands.Allocate, commands.Release)

_LEASES = table_of(orm.LeaseRow)
_SLOTS = table_of(orm.LeaseSlotRow)


def _attributes(mapped: type[orm.Base]) -> list[tuple[NamedColumn[Any], str]]:
    """(column, ORM attribute name) of each column of a mapped class."""
    mapper = inspect_mapped(mapped)
    return [(prop.columns[0], prop.key) for prop in mapper.column_attrs]


_LEASE_ATTRS = _attributes(orm.LeaseRow)
_SLOT_ATTRS = _attributes(orm.LeaseSlotRow)


class SlotSnapshot:
    """A ``lease_slots`` row's values under the ORM's attribute names."""

    # the columns the store reads from a snapshot (the others are set as attributes too)
    id: int
    live: bool
    create: bool

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)


class LeaseSnapshot:
    """A ``leases`` row's values under the ORM's attribute names, and its slots in id order."""

    slots: list[SlotSnapshot]
    # the columns the store reads from a snapshot (the others are set as attributes too)
    id: str
    state: str
    reclaim_acting: datetime | None
    reclaim_deadline: datetime | None

    def __init__(self, values: dict[str, Any]) -> None:
        self.__dict__.update(values)
        self.slots = []

    @property
    def eligible(self) -> bool:
        """Whether a release may end this lease from the snapshot (see the module)."""
        return (
            self.state in ("granted", "active")
            and self.reclaim_acting is None
            and self.reclaim_deadline is None
            and not any(s.create for s in self.slots)
        )


def released_once(batch: Iterable[commands.Command]) -> list[str]:
    """The lease ids a batch may release from snapshots: none unless every command is an
    ``Allocate`` or a ``Release``; then those released exactly once."""
    seen: dict[str, int] = {}
    for cmd in batch:
        if not isinstance(cmd, _SIMPLE):
            return []
        if isinstance(cmd, commands.Release) and isinstance(cmd.lease_id, str):
            seen[cmd.lease_id] = seen.get(cmd.lease_id, 0) + 1
    return [lease_id for lease_id, n in seen.items() if n == 1]


def _select() -> str:
    """The query: every column of the leases and of their slots (in that order), by id."""
    quote = postgresql.dialect().identifier_preparer.quote  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it unannotated
    lease = ", ".join(f"l.{quote(c.name)}" for c, _ in _LEASE_ATTRS)
    slot = ", ".join(f"s.{quote(c.name)}" for c, _ in _SLOT_ATTRS)
    # The slots as a lateral subquery that the planner may not merge into a join (OFFSET 0):
    # an index probe per lease. As a plain join, on statistics that lag behind the table (a
    # new pool's first minutes, before autovacuum's first ANALYZE), PostgreSQL hashed the whole
    # slots table for 8 leases: 1.5-2.5 ms per batch, growing with every lease ever made.
    return (
        f"SELECT {lease}, {slot} FROM {_LEASES.name} AS l "
        f"LEFT JOIN LATERAL (SELECT * FROM {_SLOTS.name} WHERE lease_id = l.id OFFSET 0) AS s "
        "ON true WHERE l.id = ANY(CAST(%(ids)s AS varchar[])) ORDER BY s.id"
    )


#: One statement text whatever the count (an array parameter): the driver prepares it once.
SELECT = _select()


def query(raw: Any, lease_ids: list[str]) -> Any:
    """Send the query on psycopg connection ``raw`` (in its pipeline: the rows come with the
    batch's version lock); returns the cursor to read them from."""
    return raw.execute(SELECT, {"ids": lease_ids})


def from_rows(rows: Iterable[tuple[Any, ...]]) -> dict[str, LeaseSnapshot]:
    """The eligible leases among the query's rows, with their slots."""
    n = len(_LEASE_ATTRS)
    lease_keys = [a for _, a in _LEASE_ATTRS]
    slot_keys = [a for _, a in _SLOT_ATTRS]
    slot_id = slot_keys.index("id")
    found: dict[str, LeaseSnapshot] = {}
    for row in rows:
        lease_values = dict(zip(lease_keys, row[:n], strict=True))
        lease = found.get(lease_values["id"])
        if lease is None:
            lease = found[lease_values["id"]] = LeaseSnapshot(lease_values)
        if row[n + slot_id] is not None:
            lease.slots.append(SlotSnapshot(dict(zip(slot_keys, row[n:], strict=True))))
    return {lease_id: lease for lease_id, lease in found.items() if lease.eligible}

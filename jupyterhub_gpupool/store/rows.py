"""Small conversions between rows and values that several store modules share."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from decimal import Decimal
from fractions import Fraction
from typing import Any, TypeVar, cast

from sqlalchemy import Connection, Table, select
from sqlalchemy import inspect as inspect_mapped
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool.allocator import Allocator
from ..pool.leases import mig_device
from ..pool.model import Node, Offer
from ..pool.placement import Slot
from ..pool.pricing import ModelPrice, Schedule
from ..pool.quota import QuotaSpec
from ..pool.reclaim import LeaseInfo, Reclaiming, ReclaimState
from ..timeparse import format_time
from .errors import StoreError

_Row = TypeVar("_Row", bound=orm.Base)


def new_row(cls: type[_Row], **values: Any) -> _Row:
    """A new ORM row of ``cls`` holding ``values``, made without the ORM's attribute events.

    A grant makes two rows (its lease and its slot) that no session holds yet; the declarative
    constructor's per-attribute bookkeeping (history, modified flags) for them was a tenth of
    the store process's CPU per batch. Nothing reads that history: a new row is inserted from
    its values as they are (``bulk.take_staged``, or the unit of work), and what is set on it
    later goes through the ORM as usual. Unknown names fail as the constructor's do."""
    unknown = values.keys() - _attribute_names(cls)
    if unknown:
        raise TypeError(f"{sorted(unknown)[0]!r} is an invalid keyword argument for {cls.__name__}")
    row = cast(_Row, _class_manager(cls).new_instance())
    row.__dict__.update(values)
    return row


@functools.cache
def _class_manager(cls: type[object]) -> Any:
    """The ORM's manager of ``cls``'s instances (looked up once: a grant makes two rows)."""
    return inspect_mapped(cls).class_manager


def slot_row(slot: Slot, *, create: bool | None = None) -> orm.LeaseSlotRow:
    """The live row of a lease's slot (``create``: whether its MIG instance is still to be
    made; the slot's own plan unless given, False for a slot moved onto what exists)."""
    return new_row(
        orm.LeaseSlotRow,
        slot_key=slot.key,
        gpu_uuid=slot.gpu,
        kind=slot.kind,
        profile=slot.profile,
        start=slot.start,
        milli=slot.milli,
        create=slot.create if create is None else create,
        live=True,
    )


@functools.cache
def _attribute_names(cls: type[object]) -> frozenset[str]:
    return frozenset(inspect_mapped(cls).attrs.keys())


@functools.cache
def table_of(mapped: type[orm.Base]) -> Table:
    """The table of a mapped class: SQLAlchemy types ``__table__`` as any ``FromClause``, and
    every class in ``orm`` maps one plain table (found once per class: every write asks for
    the version row's and the audit log's)."""
    table = mapped.__table__
    if not isinstance(table, Table):
        raise TypeError(f"{mapped.__name__} is not mapped to a table")
    return table


def driver_connection(conn: Connection) -> Any:
    """The psycopg (or sqlite3) connection under ``conn``; SQLAlchemy types it optional
    (None once the pool has detached it, never while ``conn`` is open)."""
    raw = conn.connection.driver_connection
    if raw is None:
        raise RuntimeError("the database connection is closed")
    return raw


def utcnow() -> datetime:
    """Naive UTC now (the database stores naive UTC)."""
    return datetime.now(timezone.utc).replace(tzinfo=None)


def epoch(dt: datetime) -> float:
    """Epoch seconds of a naive UTC datetime."""
    return dt.replace(tzinfo=timezone.utc).timestamp()


def from_epoch(seconds: float) -> datetime:
    """The naive UTC datetime of epoch seconds."""
    return datetime.fromtimestamp(seconds, timezone.utc).replace(tzinfo=None)


def aware(dt: datetime | None) -> datetime | None:
    """A row's naive UTC datetime as the aware one ``pool/`` reads (None stays None)."""
    return None if dt is None else dt.replace(tzinfo=timezone.utc)


def naive(dt: datetime | None) -> datetime | None:
    """A moment ``pool/`` answered (aware UTC) as the naive UTC the rows and views keep."""
    return None if dt is None else dt.astimezone(timezone.utc).replace(tzinfo=None)


def event_data(data: Mapping[str, Any]) -> dict[str, Any]:
    """An audit event's data from what ``pool/`` said: its moments written as text, as every
    event's data has them (the data is JSON)."""
    return {k: format_time(v) if isinstance(v, datetime) else v for k, v in data.items()}


#: The counts of ``ReclaimState`` kept in ``LeaseRow.reclaim_state`` (the notice has columns).
_COUNTS = (
    "idle_since",
    "gpu_idle_since",
    "last_busy",
    "extensions",
    "snooze_until",
    "age_snooze_until",
)


def reclaim_state(row: orm.LeaseRow) -> ReclaimState:
    """The lease's persisted reclaim state, notice included."""
    counts = {k: v for k, v in (row.reclaim_state or {}).items() if k in _COUNTS}
    notice = None
    if row.reclaim_kind is not None and row.reclaim_deadline is not None:
        notice = Reclaiming(
            row.reclaim_kind,
            epoch(row.reclaim_deadline),
            row.reclaim_reason or "",
            row.reclaim_action or "stop",
            epoch(row.reclaim_issued or row.reclaim_deadline),
            bool(row.reclaim_pressure),
            row.reclaim_for,
        )
    return ReclaimState(**counts, reclaiming=notice)


def set_reclaim_state(row: orm.LeaseRow, state: ReclaimState) -> None:
    """Write ``state`` into the row: the counts, and the notice (or its absence)."""
    row.reclaim_state = {k: getattr(state, k) for k in _COUNTS}
    rec = state.reclaiming
    if rec is None:
        row.reclaim_kind = row.reclaim_action = row.reclaim_for = None
        row.reclaim_deadline = row.reclaim_issued = None
        row.reclaim_reason, row.reclaim_pressure = None, False
        return
    row.reclaim_kind, row.reclaim_action, row.reclaim_for = rec.kind, rec.action, rec.for_request
    row.reclaim_deadline, row.reclaim_issued = from_epoch(rec.deadline), from_epoch(rec.issued_at)
    row.reclaim_reason, row.reclaim_pressure = rec.reason, rec.pressure


def lease_info(row: orm.LeaseRow) -> LeaseInfo:
    """A live lease as the reclaim rules read it (``pool.reclaim.LeaseInfo``)."""
    return LeaseInfo(
        row.id,
        row.user,
        row.offer,
        Fraction(row.units),
        epoch(row.granted or row.created),
        group=row.group,
        groups=tuple(row.groups or ()),
        # an approved exception is the administrator's call until it lapses: it is not
        # borrowed capacity a waiter within guarantee may have back
        borrowed=row.borrowed and not row.exception,
        models=(row.model,) if row.model else (),
        state=reclaim_state(row),
    )


def mig_devices(
    alloc: Allocator | None, row: orm.LeaseRow
) -> dict[tuple[str, int | None], tuple[str | None, bool]]:
    """A live lease's MIG instances: (GPU, start) → (``MIG-…`` uuid, whether it exists)."""
    if row.state not in orm.LIVE_STATES:
        return {}
    return {
        (s.gpu_uuid, s.start): mig_device(
            None if alloc is None else alloc.gpus.get(s.gpu_uuid), row.id, s.start
        )
        for s in row.slots
        if s.kind == "mig"
    }


def held_hours(row: orm.LeaseRow, start: datetime, end: datetime) -> float:
    """Unit-hours ``row`` was held within [start, end)."""
    if row.granted is None:
        return 0.0
    a = max(row.granted, start)
    b = min(row.released or end, end)
    return max(0.0, (b - a).total_seconds() / 3600.0) * row.units_f


def check_quota_kind(kind: str) -> str:
    """Quotas exist for ``users`` and ``groups`` (the URL's kind); returns the row's kind."""
    if kind not in ("users", "groups"):
        raise StoreError(
            "not_found", f"no quota kind {kind!r}", field="kind", allowed=["users", "groups"]
        )
    return kind[:-1]


def set_quota(row: orm.QuotaRow, spec: QuotaSpec) -> None:
    """Write a validated quota into its row."""
    row.guarantee = float(spec.guarantee)
    row.limit = None if spec.limit is None else float(spec.limit)
    row.budget = None if spec.budget is None else float(spec.budget)
    row.period = spec.period
    row.exception = None if spec.exception is None else float(spec.exception)
    row.budget_action = spec.budget_action
    row.budget_minimum = float(spec.budget_minimum)


def offer_spec(offer: Offer) -> dict[str, Any]:
    """An offer as stored and served (unset fields left out)."""
    spec = {
        "name": offer.name,
        "kind": offer.kind,
        "display_name": offer.display_name,
        "description": offer.description,
        "count": offer.count,
        "profile": offer.profile,
        "models": list(offer.models),
        "fraction": offer.fraction,
        "min_memory_gb": offer.min_memory_gb,
        "cpu_milli": offer.cpu_milli,
        "memory_mib": offer.memory_mib,
        "groups": list(offer.groups),
        "clusters": list(offer.clusters),
        "priority_class": offer.priority_class,
        "approval": offer.approval,
        "fallback": offer.fallback or None,  # said only where allowed
    }
    return {k: v for k, v in spec.items() if v is not None}


def schedules(rows: Iterable[orm.PriceRow]) -> dict[str, Schedule]:
    """The recorded price rows as each model's schedule (by start)."""
    out: dict[str, list[tuple[datetime, ModelPrice | None]]] = {}
    for r in sorted(rows, key=lambda r: (r.model, r.start)):
        price = None if r.held is None else ModelPrice(Decimal(r.held), Decimal(r.busy or r.held))
        out.setdefault(r.model, []).append((r.start, price))
    return {m: tuple(s) for m, s in out.items()}


def upsert_insert(db: Session, mapped: type[orm.Base]) -> postgresql.Insert | sqlite.Insert:
    """An INSERT into ``mapped``'s table in the session's dialect, whose ``ON CONFLICT``
    clauses (``excluded``, ``on_conflict_do_update``/``_nothing``) both dialects share."""
    if db.get_bind().dialect.name == "postgresql":
        return postgresql.insert(mapped)
    return sqlite.insert(mapped)


def node_row(db: Session, node: Node, source: str, now: datetime) -> orm.NodeRow:
    """``node``'s row (made if new) with what ``source`` (``agent``, ``config``) says of the
    node itself at ``now``; its GPUs' rows are the caller's to write."""
    row = orm.NodeRow.find(db, node.name)
    if row is None:
        row = orm.NodeRow(name=node.name, labels={})
        db.add(row)
    row.cluster, row.cpu_milli, row.memory_mib = node.cluster, node.cpu_milli, node.memory_mib
    row.labels, row.source, row.last_seen = dict(node.labels), source, now
    return row


def live_slots(
    db: Session, gpus: Iterable[str], *, mig_only: bool = False
) -> list[orm.LeaseSlotRow]:
    """The live slots on ``gpus`` (a node's), their leases loaded, by lease: what an
    inventory's or a MIG result's rule reads of who holds what."""
    q = select(orm.LeaseSlotRow).where(
        orm.LeaseSlotRow.gpu_uuid.in_(list(gpus)), orm.LeaseSlotRow.live
    )
    if mig_only:
        q = q.where(orm.LeaseSlotRow.kind == "mig")
    q = q.options(selectinload(orm.LeaseSlotRow.lease))
    return list(db.scalars(q.order_by(orm.LeaseSlotRow.lease_id, orm.LeaseSlotRow.id)))

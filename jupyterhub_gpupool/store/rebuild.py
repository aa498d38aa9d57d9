"""The allocator, built from the rows: what a process decides with after a restart, after
another replica's commits, and after a transaction that failed (every command of this process
changes it in place)."""

from __future__ import annotations

from collections.abc import Collection, Iterable
from datetime import datetime
from fractions import Fraction
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session, selectinload

from .. import orm
from ..pool.allocator import Allocator, Lease
from ..pool.catalog import Catalog
from ..pool.dramig import made_by_claim
from ..pool.headroom import Headroom
from ..pool.migplan import mig_key, with_retiring
from ..pool.model import Gpu, MigInstance, Node, Offer, Request, parse_offer
from ..pool.outside import OutsideHolds
from ..pool.placement import Slot
from ..pool.queue import Waiter
from ..pool.quota import QuotaBook, period_start
from .read.quotas import quota_spec
from .rows import epoch, held_hours


def instances_of(catalog: Catalog, g: Any, instances: list[Any] | None = None) -> list[MigInstance]:
    """The GPU's instances for the allocator: the wanted ones, and on a dynamic GPU the
    unwanted ones the node still has, held by ``RETIRING`` so nothing goes over them.

    One in the way of a wanted instance (made by hand, found late) is left out: the plan
    destroys it first, or fails the grant when it cannot go. ``g`` is a ``GpuRow`` or a row
    of its columns; ``instances``, its ``MigInstanceRow``s (or their columns) by start
    (default: ``g.instances``).
    """
    instances = g.instances if instances is None else instances
    out = [MigInstance(i.profile, i.start, i.uuid) for i in instances]
    if g.dynamic_mig and g.observed:
        model = catalog.model_for_nvml(g.model, g.memory_mib)
        seen = [(*mig_key(o), o.get("uuid")) for o in g.observed]
        out = with_retiring(model, out, seen)
    return out


def request_of(row: Any) -> Request:
    """The allocator's request behind a lease row."""
    return Request(
        row.id,
        row.user,
        row.offer,
        row.server,
        row.group,
        tuple(row.groups or ()),
        row.priority,
        epoch(row.created),
        tuple(row.clusters or ()),
        bool(row.exception),
        row.replicas or 1,
        row.workload,
    )


def lease_of(row: Any, slots: Iterable[Any]) -> Lease:
    """The allocator's lease behind a live lease row and its slot rows (ORM or Core)."""
    return Lease(
        row.id,
        request_of(row),
        row.offer,
        row.node or "",
        tuple(
            Slot(s.gpu_uuid, s.kind, s.milli, s.profile, s.start, s.create) for s in slots if s.live
        ),
        Fraction(row.units),
        row.group,
        row.borrowed,
    )


def waiter_of(row: Any) -> Waiter:
    """The allocator's waiter behind a queued lease row (ORM or Core)."""
    return Waiter(
        request_of(row),
        Fraction(row.units),
        row.group,
        row.within_guarantee,
        row.reason or "no_capacity",
        epoch(row.queued_since or row.created),
        row.held_node,
    )


def quota_book(db: Session, now: datetime) -> QuotaBook:
    """Every quota row, and the budget hours used this period."""
    book = QuotaBook()
    for q in db.scalars(select(orm.QuotaRow)):
        spec = quota_spec(q)
        if q.kind == "user":
            book.users[q.name] = spec
        elif q.kind == "group":
            book.groups[q.name] = spec
        else:
            book.default_user = spec
    book.used_hours = used_hours(db, book, now)
    return book


def used_hours(db: Session, book: QuotaBook, now: datetime) -> dict[str, float]:
    """Unit-hours used this period by users and groups that have a budget (groups keyed
    ``group:<name>``), reading only leases that overlap the earliest period start."""
    budgets = {u: s for u, s in book.users.items() if s.budget is not None}
    gbudgets = {g: s for g, s in book.groups.items() if s.budget is not None}
    if book.default_user.budget is None and not budgets and not gbudgets:
        return {}
    specs = [*budgets.values(), *gbudgets.values(), book.default_user]
    earliest = min(period_start(now, spec.period) for spec in specs)
    used: dict[str, float] = {}
    rows = db.scalars(
        select(orm.LeaseRow).where(
            orm.LeaseRow.granted.is_not(None),
            or_(orm.LeaseRow.released.is_(None), orm.LeaseRow.released >= earliest),
        )
    )
    for row in rows:
        spec = book.users.get(row.user, book.default_user)
        if spec.budget is not None:
            used[row.user] = used.get(row.user, 0.0) + held_hours(
                row, period_start(now, spec.period), now
            )
        if row.group in gbudgets:
            key = f"group:{row.group}"
            used[key] = used.get(key, 0.0) + held_hours(
                row, period_start(now, gbudgets[row.group].period), now
            )
    return used


def build_allocator(
    db: Session,
    catalog: Catalog,
    now: datetime,
    *,
    aging_interval: float,
    reserve_after: float,
    dra_dynamic_mig: Collection[str] = frozenset(),
    headroom: Headroom | None = None,
) -> Allocator:
    """An allocator holding exactly what the rows say: inventory, offers, quotas, live
    leases and the queue (``dra_dynamic_mig``: see ``inventory_of``; ``headroom``: the pool
    config's, ``pool.headroom``)."""
    nodes, offers = inventory_of(db, catalog, dra_dynamic_mig)
    allocator = Allocator(
        nodes,
        offers,
        quota_book(db, now),
        aging_interval=aging_interval,
        reserve_after=reserve_after,
        headroom=headroom,
    )
    live = db.scalars(
        select(orm.LeaseRow)
        .where(orm.LeaseRow.state.in_(orm.LIVE_STATES))
        .options(selectinload(orm.LeaseRow.slots))
    )
    for row in live:
        allocator.restore(lease_of(row, row.slots))
    for row in db.scalars(select(orm.LeaseRow).where(orm.LeaseRow.state == "queued")):
        allocator.restore_waiter(waiter_of(row))
    for name, outside in db.execute(
        select(orm.NodeRow.name, orm.NodeRow.outside).where(orm.NodeRow.outside.is_not(None))
    ):
        if name in allocator.nodes:  # after the leases: a mark never covers a lease's device
            allocator.set_outside(name, OutsideHolds.from_json(outside))
    return allocator


def inventory_of(
    db: Session, catalog: Catalog, dra_dynamic_mig: Collection[str] = frozenset()
) -> tuple[list[Node], list[Offer]]:
    """The nodes (with their GPUs and MIG instances, none held) and the offers the rows
    hold: what a fresh allocator starts from (the what-if replay starts from it too). The
    MIG GPUs of the nodes and clusters in ``dra_dynamic_mig`` are the DRA driver's
    (``pool.dramig``): dynamic, made per claim.

    Read with three Core queries, not ORM objects: another replica's commits make every
    batch rebuild the allocator, and loading the inventory's rows as objects was three
    quarters of a rebuild. (Pending ORM changes are not flushed first: callers flush.)
    """
    conn = db.connection()
    n, g, m = orm.NodeRow.__table__, orm.GpuRow.__table__, orm.MigInstanceRow.__table__
    instances: dict[int, list[Any]] = {}
    for r in conn.execute(
        select(m.c.gpu_id, m.c.profile, m.c.start, m.c.uuid).order_by(m.c.gpu_id, m.c.start)
    ):
        instances.setdefault(r.gpu_id, []).append(r)
    gpus_of: dict[int, list[Any]] = {}
    for r in conn.execute(select(g).order_by(g.c.node_id, g.c.index)):
        gpus_of.setdefault(r.node_id, []).append(r)
    nodes = []
    for row in conn.execute(select(n).order_by(n.c.id)):
        gpus = [
            Gpu(
                gr.uuid,
                gr.index,
                catalog.model_for_nvml(gr.model, gr.memory_mib),
                row.name,
                gr.mig_enabled,
                gr.dynamic_mig,
                gr.sharing,
                gr.healthy,
                gr.cordoned,
                instances_of(catalog, gr, instances.get(gr.id, [])),
                mig_by_claim=made_by_claim(row.name, row.cluster, gr.mig_enabled, dra_dynamic_mig),
            )
            for gr in gpus_of.get(row.id, [])
        ]
        nodes.append(
            Node(
                row.name,
                row.cluster,
                row.cpu_milli,
                row.memory_mib,
                gpus,
                row.cordoned,
                row.draining,
                dict(row.labels or {}),
                unreachable=row.unreachable,
            )
        )
    offers = [
        parse_offer(r.spec, catalog)
        for r in db.scalars(select(orm.OfferRow).order_by(orm.OfferRow.position, orm.OfferRow.name))
    ]
    return nodes, offers

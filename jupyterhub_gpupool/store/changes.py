"""Catching up with another process's decisions by reloading the leases they wrote.

Every process that decides on a pool keeps an allocator in memory. When another one committed
since (another replica, or the service's store process for the service's own views), the
allocator used to be rebuilt from every row: ~30 ms at 512 GPUs on the project's VM, in each
batch of two replicas taking turns, which made two replicas slower together than one alone.

Now a batch of decisions (``StoreCore.run_batch``) that wrote nothing but leases, their slots
and audit events also writes one ``pool_changes`` row: its pool version and the ids of the
leases it wrote. A process that last saw version ``v`` and finds ``v + k`` reads the ``k``
rows; when there are ``k`` of them, it takes the old state of those leases out of its allocator
and puts in what their rows say now, as a rebuild would for them. Anything else makes it
rebuild as before:

- a version without a row: any other change (inventory, quotas, offers, MIG results, config,
  approvals, reclaim rounds) writes none, and code before this one wrote none;
- a batch that touched another table (the hooks of ``watch_sessions`` find it among the
  session's changes or statements; it writes no row);
- a lease with a MIG slot, before or after: the instances the pool makes and retires are
  inventory rows too;
- more than ``MAX_LEASES`` leases to reload, or a node or GPU the allocator lacks.

Rows older than ``KEEP`` versions are deleted now and then (a process that far behind
rebuilds). Bulk writes that bypass the session (``bulk.py``) name their leases through its
release queue and its staged new leases.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from itertools import chain
from typing import Any

from sqlalchemy import delete, event, insert, select
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker

from .. import orm
from ..pool.allocator import Allocator
from .bulk import Statement, queued_release_ids, staged_ids
from .rebuild import lease_of, waiter_of
from .rows import table_of

#: Versions of history kept; a process further behind rebuilds.
KEEP = 2000
#: Prune every this many versions.
PRUNE_EVERY = 200
#: More leases than this to reload: rebuild instead (as cheap by then).
MAX_LEASES = 5000

_TOUCHED = "gpupool_touched"  # Session.info: lease ids written so far
_OTHER = "gpupool_other_rows"  # Session.info: True once anything but leases was written
_PLAIN = frozenset({"gpu", "shared"})  # slot kinds whose whole state is in lease_slots


def _note_objects(db: Session, objects: Iterable[Any]) -> None:
    touched: set[str] = db.info.setdefault(_TOUCHED, set())
    for obj in objects:
        if isinstance(obj, orm.LeaseRow):
            touched.add(obj.id)
        elif isinstance(obj, orm.LeaseSlotRow):
            # a slot not yet flushed may have neither (the ORM types both as always set); its
            # lease is looked at only then (a relationship's read costs more than a column's)
            lease_id: str | None = obj.lease_id
            if not lease_id:
                lease: orm.LeaseRow | None = obj.lease
                lease_id = lease.id if lease is not None else None
            if lease_id is None:
                db.info[_OTHER] = True
            else:
                touched.add(lease_id)
        elif not isinstance(obj, orm.EventRow):
            db.info[_OTHER] = True


def _before_flush(db: Session, _context: Any, _objects: Any) -> None:
    _note_objects(db, chain(db.new, db.dirty, db.deleted))


def _before_statement(state: ORMExecuteState) -> None:
    if not state.is_select:  # an ORM-level INSERT/UPDATE/DELETE: whatever it was, rebuild
        state.session.info[_OTHER] = True


def watch_sessions(factory: sessionmaker[Session]) -> None:
    """Note what each session of ``factory`` writes."""
    event.listen(factory, "before_flush", _before_flush)
    event.listen(factory, "do_orm_execute", _before_statement)


def touched_leases(db: Session) -> set[str] | None:
    """The leases this transaction wrote or will write at commit; None when it wrote anything
    else too (then other processes must rebuild)."""
    _note_objects(db, chain(db.new, db.dirty, db.deleted))  # what the commit will flush
    if db.info.get(_OTHER):
        return None
    touched: set[str] = db.info.get(_TOUCHED, set())
    return touched | queued_release_ids(db) | staged_ids(db)


_RECORD = (
    "INSERT INTO pool_changes (version, leases) VALUES (%(c_version)s, CAST(%(c_leases)s AS json))"
)


def record_statement(version: int, leases: set[str]) -> Statement:
    """PostgreSQL: the statement writing the change row of ``version``, to send with the
    batch's others (``bulk.run_as_one``)."""
    return _RECORD, {"c_version": version, "c_leases": json.dumps(sorted(leases))}


def record(db: Session, version: int, leases: set[str]) -> None:
    """Write the change row of ``version`` (and now and then drop old ones)."""
    table = table_of(orm.PoolChangeRow)
    conn = db.connection()
    conn.execute(insert(table).values(version=version, leases=sorted(leases)))
    prune(db, version)


def prune(db: Session, version: int) -> None:
    """Now and then (every ``PRUNE_EVERY`` versions) drop the rows older than ``KEEP``."""
    if version % PRUNE_EVERY == 0:
        table = table_of(orm.PoolChangeRow)
        db.connection().execute(delete(table).where(table.c.version <= version - KEEP))


def catch_up(db: Session, allocator: Allocator, seen: int, now: int) -> bool | None:
    """Bring ``allocator`` (in step with version ``seen``) to version ``now`` by reloading the
    leases written in between. Returns None (nothing changed) when it cannot, and the caller
    rebuilds; else whether a reloaded lease awaits approval."""
    table = table_of(orm.PoolChangeRow)
    conn = db.connection()
    changes = conn.execute(
        select(table.c.leases).where(table.c.version > seen, table.c.version <= now)
    ).all()
    if len(changes) != now - seen:
        return None
    ids = {lease_id for (leases,) in changes for lease_id in leases}
    if len(ids) > MAX_LEASES:
        return None
    lease, slot = orm.LeaseRow.__table__, orm.LeaseSlotRow.__table__
    rows = conn.execute(select(lease).where(lease.c.id.in_(ids))).all() if ids else []
    slots: dict[str, list[Any]] = {}
    if ids:
        live = select(slot).where(slot.c.lease_id.in_(ids), slot.c.live).order_by(slot.c.id)
        for s in conn.execute(live):
            slots.setdefault(s.lease_id, []).append(s)
    for lease_id in ids:  # only what lease_slots tells whole, on what the allocator knows
        old = allocator.leases.get(lease_id)
        if old is not None and any(s.kind not in _PLAIN for s in old.slots):
            return None
    for s in chain.from_iterable(slots.values()):
        if s.kind not in _PLAIN or s.gpu_uuid not in allocator.gpus:
            return None
    if any(r.node and r.node not in allocator.nodes for r in rows):
        return None
    for lease_id in ids:
        allocator.forget(lease_id)
    awaiting = False
    for row in rows:
        if row.state in orm.LIVE_STATES:
            allocator.restore(lease_of(row, slots.get(row.id, ())))
        elif row.state == "queued":
            allocator.restore_waiter(waiter_of(row))
        elif row.state == "awaiting_approval":
            awaiting = True
    return awaiting

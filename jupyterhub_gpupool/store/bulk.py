"""Many rows in one statement on PostgreSQL: the arrays of their columns, sent in binary and
spread into rows by ``unnest``; and a transaction's releases written that way.

A batch of decisions writes the same kind of row many times over (an audit event per grant and
per release, a released lease and its slots per release). As an ``executemany``, psycopg sends
and tracks one statement per row in Python, and SQLAlchemy builds the parameters of each: on the
project's 2-core VM 64 audit events took 3–5 ms of CPU that way, and 0.6–1.1 ms as one statement
of six arrays (text arrays in psycopg's text format cost almost as much as the rows one by one:
every element is quoted with a regular expression; binary has no quoting). The statements'
text never changes, so the driver prepares each once per connection.

SQLite keeps the plain ``executemany`` and the ORM's writes: it runs in the process, with no
round trips to save.

Releases: ``_finish`` (``apply.py``) hands a released lease that is already in the database to
``queue_release``, which sets the row's new values as if loaded (no ORM history, so the unit of
work writes nothing for them) and keeps them for ``flush_released``. That writes them before
anything else of the transaction reaches the database: before any ORM flush (a grant later in
the batch may take the same slot, and the unique index on live slots must see it freed first),
before any ORM query that would autoflush, and before the commit.
"""

from __future__ import annotations

import json
from typing import Any

from sqlalchemy import Connection, event, insert, inspect
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from .. import orm

#: Below this many rows the one-row statement is as cheap.
MIN_ROWS = 2

#: ``%(name)b``: psycopg sends the parameter in binary.
_INSERT_EVENTS = (
    'INSERT INTO events (ts, actor, kind, lease_id, "user", data) '
    "SELECT ts, actor, kind, lease_id, who, CAST(data AS json) FROM unnest("
    "CAST(%(ts)b AS timestamp[]), CAST(%(actor)b AS varchar[]), CAST(%(kind)b AS varchar[]), "
    "CAST(%(lease_id)b AS varchar[]), CAST(%(user)b AS varchar[]), CAST(%(data)b AS text[])"
    ") AS e(ts, actor, kind, lease_id, who, data)"
)


def _bulk(conn: Connection, rows: list[Any]) -> bool:
    return len(rows) >= MIN_ROWS and conn.dialect.name == "postgresql"


def insert_events(conn: Connection, events: list[dict[str, Any]]) -> None:
    """Write audit events (dicts of the ``events`` columns but ``id``), in their order."""
    if not _bulk(conn, events):
        conn.execute(insert(orm.EventRow.__table__), events)
        return
    columns: dict[str, list[Any]] = {
        c: [e[c] for e in events] for c in ("ts", "actor", "kind", "lease_id", "user")
    }
    # what SQLAlchemy's JSON type would send for each (its default serializer)
    columns["data"] = [json.dumps(e["data"]) for e in events]
    conn.exec_driver_sql(_INSERT_EVENTS, columns)


_RELEASE_LEASES = (
    "UPDATE leases SET state = 'released', released = r.released, "
    "release_reason = r.reason, reclaim_deadline = NULL "
    "FROM unnest(CAST(%(id)b AS varchar[]), CAST(%(released)b AS timestamp[]), "
    "CAST(%(reason)b AS varchar[])) AS r(id, released, reason) WHERE leases.id = r.id"
)
_END_SLOTS = "UPDATE lease_slots SET live = false WHERE id = ANY(CAST(%(ids)b AS integer[]))"


def release_rows(conn: Connection, leases: list[tuple[str, Any, str]], slots: list[int]) -> None:
    """PostgreSQL: mark leases released ``(id, released, reason)`` and slots (ids) not live."""
    if leases:
        ids, when, why = (list(c) for c in zip(*leases, strict=True))
        conn.exec_driver_sql(_RELEASE_LEASES, {"id": ids, "released": when, "reason": why})
    if slots:
        conn.exec_driver_sql(_END_SLOTS, {"ids": slots})


#: ``Session.info`` key of a transaction's queued releases: ([(id, released, reason)], [slot
#: id], [row]). The rows are kept to the end of the transaction: the session holds an unchanged
#: row only weakly, and a later call of the batch looks the released row up in its identity map
#: (``StoreCore.awaiting_requests``), as it finds a row the ORM has yet to write.
_QUEUE = "gpupool_releases"


def collect_releases(db: Session) -> None:
    """On PostgreSQL, queue this transaction's releases (``queue_release``) to write them
    together (SQLite keeps the ORM's writes: no round trips to save)."""
    if db.get_bind().dialect.name == "postgresql":
        db.info[_QUEUE] = ([], [], [])


def queue_release(db: Session, row: orm.LeaseRow, released: Any, reason: str) -> bool:
    """Release ``row`` and its slots in memory and queue their writes; False (nothing done)
    outside a collecting transaction or for a row not yet in the database (the ORM inserts it
    with its values)."""
    queue = db.info.get(_QUEUE)
    if queue is None or not inspect(row).persistent:
        return False
    for name, value in (
        ("state", "released"),
        ("released", released),
        ("release_reason", reason),
        ("reclaim_deadline", None),
    ):
        set_committed_value(row, name, value)
    queue[0].append((row.id, released, reason))
    queue[2].append(row)
    for slot in row.slots:
        if inspect(slot).persistent:
            set_committed_value(slot, "live", False)
            queue[1].append(slot.id)
        else:  # granted in this transaction: inserted as it is
            slot.live = False
    return True


def queued_release_ids(db: Session) -> set[str]:
    """The leases this transaction released through the queue (``changes.py`` names them)."""
    queue = db.info.get(_QUEUE)
    return {row.id for row in queue[2]} if queue is not None else set()


def flush_released(db: Session) -> None:
    """Write the queued releases now (see the module's docstring for when)."""
    queue = db.info.get(_QUEUE)
    if queue is None or not (queue[0] or queue[1]):
        return
    leases, slots = list(queue[0]), list(queue[1])
    queue[0].clear()
    queue[1].clear()
    release_rows(db.connection(), leases, slots)


def _before_orm_statement(state: ORMExecuteState) -> None:
    if state.session.autoflush:  # the statement would see what the session holds
        flush_released(state.session)


def watch_sessions(factory: sessionmaker) -> None:
    """Write a session's queued releases before each of its flushes and autoflushing queries."""
    event.listen(factory, "before_flush", lambda db, _context, _objects: flush_released(db))
    event.listen(factory, "do_orm_execute", _before_orm_statement)

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

New leases: in a batch (``StoreCore.run_batch``, where nothing autoflushes) ``stage_lease`` keeps
a new lease row out of the session, and at the end ``take_staged`` gives the statements that
insert all of them and their slots as arrays. Through the ORM the same rows took two ``INSERT``
statements with a parameter set per row, and the unit of work's bookkeeping around them: the
largest share of a batch's CPU on the project's VM. A flush in the middle of a batch (rare: a
MIG instance retired) hands the staged rows to the session first; the ORM writes them then.

``run_as_one`` sends several such statements as one (data-modifying CTEs), and ``pipelined``
sends the end of a batch (its releases; then its new leases, audit events and change record;
then the ``COMMIT``) to PostgreSQL in one round trip.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from typing import Any

from sqlalchemy import JSON, Connection, Integer, Table, event, exc, inspect
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import ORMExecuteState, Session, sessionmaker
from sqlalchemy.orm.attributes import set_committed_value

from .. import orm
from .rows import driver_connection, table_of
from .snapshots import LeaseSnapshot


def _psycopg() -> Any:
    """psycopg, imported where a PostgreSQL code path first runs (``dbutil.make_engine``
    has already said which extra brings it when a PostgreSQL URL is configured without it)."""
    import psycopg

    return psycopg


def psycopg_idle() -> Any:
    """psycopg's transaction status of a connection outside any transaction."""
    return _psycopg().pq.TransactionStatus.IDLE


#: One statement and its parameters (each part's names carry a prefix of its own).
Statement = tuple[str, dict[str, Any]]


def run_as_one(conn: Connection, statements: list[Statement]) -> None:
    """Send ``statements`` as one: all but the last as data-modifying CTEs of the last. Each
    must write a table the others neither write nor read (their order within the statement is
    the database's), and foreign keys between them are checked at its end. One statement
    instead of several is one send and one wake-up of the database process less each, which
    on a 2-core VM cost more than the statements' own work."""
    if not statements:
        return
    *ctes, (sql, params) = statements
    if ctes:
        merged: dict[str, Any] = {}
        for _, its in ctes:
            merged |= its
        sql = "WITH " + ", ".join(f"w{i} AS ({c})" for i, (c, _) in enumerate(ctes)) + " " + sql
        params = merged | params
    conn.exec_driver_sql(sql, params)


#: ``%(name)b``: psycopg sends the parameter in binary.
_INSERT_EVENTS = (
    'INSERT INTO events (ts, actor, kind, lease_id, "user", data) '
    "SELECT ts, actor, kind, lease_id, who, CAST(data AS json) FROM unnest("
    "CAST(%(e_ts)b AS timestamp[]), CAST(%(e_actor)b AS varchar[]), "
    "CAST(%(e_kind)b AS varchar[]), CAST(%(e_lease_id)b AS varchar[]), "
    "CAST(%(e_user)b AS varchar[]), CAST(%(e_data)b AS text[])"
    ") AS e(ts, actor, kind, lease_id, who, data)"
)


def event_statements(events: list[dict[str, Any]]) -> list[Statement]:
    """PostgreSQL: the statement writing audit events (dicts of the ``events`` columns but
    ``id``) in their order, however many: one row too (a pipelined commit reads no results,
    and the Core ``executemany`` of one row would)."""
    if not events:
        return []
    columns: dict[str, list[Any]] = {
        f"e_{c}": [e[c] for e in events] for c in ("ts", "actor", "kind", "lease_id", "user")
    }
    # what SQLAlchemy's JSON type would send for each (its default serializer)
    columns["e_data"] = [json.dumps(e["data"]) for e in events]
    return [(_INSERT_EVENTS, columns)]


#: The leases by primary key, also as ``id = ANY(...)`` (which the join implies): the planner
#: then reaches them through the index once ``leases`` holds a few hundred rows. With the join
#: alone it hashed the unnested ids and scanned the whole table, a plan a prepared statement keeps
#: as the table grows (``dbutil.analyse_if_never``).
_RELEASE_LEASES = (
    "UPDATE leases SET state = 'released', released = r.released, "
    "release_reason = r.reason, reclaim_deadline = NULL "
    "FROM unnest(CAST(%(r_id)b AS varchar[]), CAST(%(r_released)b AS timestamp[]), "
    "CAST(%(r_reason)b AS varchar[])) AS r(id, released, reason) "
    "WHERE leases.id = r.id AND leases.id = ANY(CAST(%(r_id)b AS varchar[]))"
)
_END_SLOTS = "UPDATE lease_slots SET live = false WHERE id = ANY(CAST(%(r_slots)b AS integer[]))"


def release_statements(leases: list[tuple[str, Any, str]], slots: list[int]) -> list[Statement]:
    """PostgreSQL: mark leases released ``(id, released, reason)`` and slots (ids) not live."""
    out: list[Statement] = []
    if leases:
        ids, when, why = (list(c) for c in zip(*leases, strict=True))
        out.append((_RELEASE_LEASES, {"r_id": ids, "r_released": when, "r_reason": why}))
    if slots:
        out.append((_END_SLOTS, {"r_slots": slots}))
    return out


@dataclasses.dataclass
class _Releases:
    """A transaction's queued releases (``Session.info[_QUEUE]``)."""

    #: (lease id, released, reason) of each lease to write as released
    leases: list[tuple[str, Any, str]] = dataclasses.field(default_factory=list)
    #: ids of the slots to write as no longer live
    slots: list[int] = dataclasses.field(default_factory=list)
    #: The rows released, kept to the end of the transaction (not only until written): the
    #: session holds an unchanged row only weakly, and a later call of the batch looks the
    #: released row up in its identity map (``StoreCore.awaiting_requests``), as it finds a
    #: row the ORM has yet to write.
    rows: list[orm.LeaseRow | LeaseSnapshot] = dataclasses.field(default_factory=list)


#: ``Session.info`` key of a transaction's ``_Releases``.
_QUEUE = "gpupool_releases"


#: ``Session.info`` key of a batch's new leases, id → row (``stage_lease``).
_NEW = "gpupool_new_leases"


def collect_writes(db: Session, *, batch: bool = False) -> None:
    """On PostgreSQL, queue this transaction's releases (``queue_release``) to write them
    together, and in a ``batch`` its new leases (``stage_lease``). SQLite keeps the ORM's
    writes: no round trips to save."""
    if db.get_bind().dialect.name == "postgresql":
        db.info[_QUEUE] = _Releases()
        if batch:
            db.info[_NEW] = {}


def queue_release(
    db: Session, row: orm.LeaseRow | LeaseSnapshot, released: Any, reason: str
) -> bool:
    """Release ``row`` and its slots in memory and queue their writes; False (nothing done)
    outside a collecting transaction or for a row not yet in the database (the ORM inserts it
    with its values)."""
    queue = db.info.get(_QUEUE)
    snapshot = isinstance(row, LeaseSnapshot)  # read without the ORM: no history to avoid
    if queue is None or not (snapshot or inspect(row).persistent):
        return False
    put = setattr if snapshot else set_committed_value
    for name, value in (
        ("state", "released"),
        ("released", released),
        ("release_reason", reason),
        ("reclaim_deadline", None),
    ):
        put(row, name, value)
    queue.leases.append((row.id, released, reason))
    queue.rows.append(row)
    for slot in row.slots:
        if snapshot or inspect(slot).persistent:
            put(slot, "live", False)
            queue.slots.append(slot.id)
        else:  # granted in this transaction: inserted as it is
            slot.live = False
    return True


def queued_release_ids(db: Session) -> set[str]:
    """The leases this transaction released through the queue (``changes.py`` names them)."""
    queue = db.info.get(_QUEUE)
    return {row.id for row in queue.rows} if queue is not None else set()


def take_released(db: Session) -> list[Statement]:
    """The statements writing the queued releases; the queue is then empty."""
    queue = db.info.get(_QUEUE)
    if queue is None or not (queue.leases or queue.slots):
        return []
    statements = release_statements(queue.leases, queue.slots)
    queue.leases, queue.slots = [], []
    return statements


def flush_released(db: Session) -> None:
    """Write the queued releases now (see the module's docstring for when)."""
    statements = take_released(db)
    if statements:
        run_as_one(db.connection(), statements)


# -- new leases -------------------------------------------------------------------------------


def stage_lease(db: Session, row: orm.LeaseRow) -> None:
    """Add a new lease (its slots may follow): in a batch on PostgreSQL kept for
    ``take_staged``, else added to the session."""
    staged = db.info.get(_NEW)
    if staged is None:
        db.add(row)
    else:
        staged[row.id] = row


def staged_lease(db: Session, lease_id: str) -> orm.LeaseRow | None:
    """A lease made earlier in this batch and not yet written (no query finds it)."""
    staged = db.info.get(_NEW)
    return staged.get(lease_id) if staged else None


def staged_ids(db: Session) -> set[str]:
    """The leases ``take_staged`` will write (``changes.py`` names them)."""
    return set(db.info.get(_NEW) or ())


class _Rows:
    """One table's rows as one ``INSERT ... SELECT ... FROM unnest(arrays)``: the statement,
    and the arrays of the values the ORM would insert for each row (its Python defaults for
    attributes never set; a JSON column's value serialised, an explicit None as JSON
    ``null`` as SQLAlchemy's JSON type does).

    A column whose array holds only None, and whose database default is NULL too, is left out
    of the statement: a new lease has 22 such columns of 42 (the reclaim, release and approval
    ones). Each array costs the driver a dump per batch, and the whole statement with them
    was longer than psycopg caches the parsing of (4,096 bytes, 50 parameters), so it parsed
    the batch's last statement anew every time. There is a statement per set of columns
    present: in practice a handful, each prepared once per connection."""

    def __init__(self, table: Table, alias: str) -> None:
        dialect = postgresql.dialect()  # type: ignore[no-untyped-call]  # SQLAlchemy leaves it unannotated
        quote = dialect.identifier_preparer.quote
        self.table = quote(table.name)
        self.alias = alias
        # (attribute, param name, is JSON, default, default is callable, NULL when left out)
        self.columns: list[tuple[str, str, bool, Any, bool, bool]] = []
        #: per column: its name, its array parameter, its value in the SELECT
        self.parts: list[tuple[str, str, str]] = []
        for col in table.columns:
            if col.primary_key and isinstance(col.type, Integer):
                continue  # the database's sequence numbers it
            is_json = isinstance(col.type, JSON)
            param = f"{alias}_{col.name}"
            default = col.default
            self.columns.append(
                (
                    col.key,
                    param,
                    is_json,
                    None if default is None else default.arg,  # type: ignore[attr-defined]  # each ColumnDefault kind has .arg; the base type does not say so
                    default is not None and default.is_callable,
                    col.server_default is None,
                )
            )
            name = quote(col.name)
            kind = "text" if is_json else col.type.compile(dialect=dialect)
            self.parts.append(
                (
                    name,
                    f"CAST(%({param})b AS {kind}[])",
                    f"CAST({alias}.{name} AS json)" if is_json else f"{alias}.{name}",
                )
            )
        self._sql: dict[tuple[int, ...], str] = {}

    def sql(self, present: tuple[int, ...]) -> str:
        """The statement inserting the columns at ``present`` (indexes into ``columns``)."""
        found = self._sql.get(present)
        if found is None:
            names, arrays, values = zip(*(self.parts[i] for i in present), strict=True)
            found = self._sql[present] = (
                f"INSERT INTO {self.table} ({', '.join(names)}) "
                f"SELECT {', '.join(values)} FROM unnest({', '.join(arrays)}) "
                f"AS {self.alias}({', '.join(names)})"
            )
        return found

    def statement(self, objs: list[Any], **fixed: list[Any]) -> Statement:
        """The statement and parameters inserting ``objs``; ``fixed`` gives some columns'
        values outright."""
        out: dict[str, list[Any]] = {}
        present: list[int] = []
        for i, (key, param, is_json, default, is_callable, null) in enumerate(self.columns):
            if key in fixed:
                values = fixed[key]
            else:
                values = []
                for obj in objs:
                    given = obj.__dict__
                    if key in given:
                        value = given[key]
                    elif default is None:
                        values.append(None)
                        continue
                    else:
                        value = default(None) if is_callable else default
                    values.append(json.dumps(value) if is_json else value)
            if null and all(v is None for v in values):
                continue  # the database writes NULL itself
            out[param] = values
            present.append(i)
        return self.sql(tuple(present)), out


_LEASES = _Rows(table_of(orm.LeaseRow), "l")
_SLOTS = _Rows(table_of(orm.LeaseSlotRow), "s")


def take_staged(db: Session) -> list[Statement]:
    """The statements inserting the batch's staged leases and their slots (to run after the
    releases: a slot freed in the batch may be held again by one of them; the slots' foreign
    key is satisfied when both run as one); nothing is staged then."""
    staged = db.info.get(_NEW)
    if not staged:
        return []
    rows = list(staged.values())
    staged.clear()
    out = [_LEASES.statement(rows)]
    slots = [(row.id, slot) for row in rows for slot in row.slots]
    if slots:
        out.append(_SLOTS.statement([s for _, s in slots], lease_id=[lid for lid, _ in slots]))
    return out


def _adopt_staged(db: Session) -> None:
    """A flush in the middle of a batch: the session writes the staged leases with it."""
    staged = db.info.get(_NEW)
    if staged:
        db.add_all(list(staged.values()))
        staged.clear()


@contextlib.contextmanager
def pipelined(db: Session) -> Iterator[bool]:
    """On PostgreSQL, when the session has nothing of its own left to flush: what the block
    sends, and a ``commit_in_pipeline`` at its end, go out together (psycopg's pipeline
    mode; a statement's error arrives as the block ends). Yields whether it does (else the
    block runs as it would)."""
    if db.get_bind().dialect.name != "postgresql" or db.new or db.dirty or db.deleted:
        yield False
        return
    conn = db.connection()
    raw = driver_connection(conn)
    try:
        with driver_errors(conn, "COMMIT"), raw.pipeline():
            yield True
    except BaseException:
        # a statement failed: the transaction is still open, aborted (the COMMIT after it
        # was skipped); SQLAlchemy would take a failed commit as the end of it
        in_error = _psycopg().pq.TransactionStatus.INERROR
        if not raw.closed and raw.pgconn.transaction_status == in_error:
            raw.rollback()
        raise


@contextlib.contextmanager
def driver_errors(conn: Connection, statement: str) -> Iterator[None]:
    """Raise what the driver raises directly (a pipeline's statements, its end) as SQLAlchemy
    raises it for a statement it ran: its exception classes, which the callers expect (a
    lost database answers 503 ``store_unavailable``), and a lost connection invalidated, so
    the pool never hands it out again."""
    psycopg = _psycopg()
    try:
        yield
    except psycopg.Error as e:
        raw = driver_connection(conn)
        lost = raw is None or raw.closed or raw.broken
        if lost:
            conn.invalidate(e)
        raise exc.DBAPIError.instance(
            statement, None, e, psycopg.Error, connection_invalidated=lost
        ) from e


def commit_in_pipeline(db: Session) -> None:
    """In ``pipelined``: the ``COMMIT`` as one more statement of the pipeline, which ends with
    it (one round trip for the lot). Committed through the session instead, psycopg would
    add a round trip for its commit's sync, another for SQLAlchemy's reset of the connection
    it returns to the pool, and more for anything else done to the connection before the
    pipeline ends; after the pipeline the session's ``commit`` finds the database's
    transaction over and sends nothing."""
    if db.new or db.dirty or db.deleted:  # the session's commit would flush after it
        raise RuntimeError("the session has rows of its own to write: commit it instead")
    db.connection().exec_driver_sql("COMMIT")


# -- the session's hooks ------------------------------------------------------------------------


def _before_flush(db: Session, _context: Any, _objects: Any) -> None:
    _adopt_staged(db)
    flush_released(db)


def _before_orm_statement(state: ORMExecuteState) -> None:
    if state.session.autoflush:  # the statement would see what the session holds
        flush_released(state.session)


def watch_sessions(factory: sessionmaker[Session]) -> None:
    """Write a session's queued releases before each of its flushes and autoflushing queries,
    and hand it the staged leases before a flush."""
    event.listen(factory, "before_flush", _before_flush)
    event.listen(factory, "do_orm_execute", _before_orm_statement)

"""Transactions, the pool lock, the in-memory allocator and the audit log: what every part of
the store stands on.

Every change runs in one transaction that first takes the pool lock (``BEGIN IMMEDIATE`` on
SQLite; on PostgreSQL the version row's row lock), then checks the pool version: when another
process changed the pool since this one last looked, the in-memory allocator catches up: the
leases its batches wrote are reloaded (``changes.py``), or after any other change it is rebuilt
from the rows. So several service replicas on one PostgreSQL database never double-grant, and a
restart (or ``kill -9``) loses nothing that was acknowledged: a grant is answered only after
its commit. Reads take no lock.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Engine, Executable, insert, select, update
from sqlalchemy.orm import Session, joinedload, sessionmaker

from .. import orm
from ..dbutil import analyse_if_never, lock_pool
from ..pool import commands
from ..pool.allocator import Allocator
from ..pool.catalog import Catalog
from ..pool.errors import PoolError
from ..pool.headroom import headroom_for
from ..pool.migplan import MAX_ATTEMPTS
from ..poolconfig import PoolConfig
from . import changes, dispatch, snapshots
from .bulk import (
    collect_writes,
    commit_in_pipeline,
    driver_errors,
    event_statements,
    pipelined,
    psycopg_idle,
    run_as_one,
    staged_lease,
    take_released,
    take_staged,
    watch_sessions,
)
from .errors import StoreError
from .rebuild import build_allocator, used_hours
from .rows import driver_connection, table_of, utcnow

log = logging.getLogger(__name__)

#: Batched commands that address a lease by id: a batch loads those leases at once.
_BY_LEASE_ID = (commands.Release, commands.Keepalive)

#: ``Session.info`` key of the leases a batch loaded up front, id → row (``_prefetch``).
_LOADED = "gpupool_loaded"

#: Set (to anything but empty or 0) to make every store write check that it runs off the
#: event loop; the test suite sets it for every process it starts.
STRICT_WRITES_ENV = "GPUPOOL_STRICT_WRITES"


class StoreCore:
    """The database, the allocator kept in step with it, and the transaction discipline.

    ``mig_attempts``: failed creations of a planned MIG instance before its grant is released.
    """

    def __init__(
        self,
        engine: Engine,
        catalog: Catalog,
        *,
        clock: Callable[[], datetime] = utcnow,
        grant_timeout: float = 600.0,
        aging_interval: float = 600.0,
        reserve_after: float = 1800.0,
        mig_attempts: int = MAX_ATTEMPTS,
        file_config: PoolConfig | None = None,
        strict_writes: bool | None = None,
        max_requests_per_user: int = 0,
        reclaim_stale_after: float = 120.0,
        reclaim_claim_timeout: float = 900.0,
        dra_dynamic_mig: Iterable[str] = (),
    ) -> None:
        self.engine = engine
        #: Nodes and clusters whose MIG instances NVIDIA's DRA driver makes per claim
        #: (``pool.dramig``).
        self.dra_dynamic_mig = frozenset(dra_dynamic_mig)
        self.catalog = catalog
        self.clock = clock
        self.grant_timeout = grant_timeout
        self.aging_interval = aging_interval
        self.reserve_after = reserve_after
        self.mig_attempts = mig_attempts
        #: Live requests (queued, granted, held) one user may have at once; 0: no cap.
        self.max_requests_per_user = max_requests_per_user
        #: Reclaim: seconds after which signals are too old to act on; seconds a claimed
        #: action may go without an outcome before a round hands it out again.
        self.reclaim_stale_after = reclaim_stale_after
        self.reclaim_claim_timeout = reclaim_claim_timeout
        if strict_writes is None:
            strict_writes = os.environ.get(STRICT_WRITES_ENV, "") not in ("", "0")
        self.strict_writes = strict_writes
        self.session_factory = sessionmaker(engine, expire_on_commit=False)
        watch_sessions(self.session_factory)  # queued releases go out before anything else
        changes.watch_sessions(self.session_factory)  # which leases a batch wrote
        self.read_factory = sessionmaker(
            engine.execution_options(gpupool_readonly=True), expire_on_commit=False
        )
        self._local = threading.local()
        #: lease id -> (user, hub): whose a lease is never changes (``ViewStore.note_holder``)
        self._lease_holders: dict[str, tuple[str, str | None]] = {}
        self._allocator: Allocator | None = None
        self._version: int | None = None
        #: How this process caught up with other processes' commits: allocator rebuilds from
        #: every row, and catch-ups that reloaded only the leases they wrote (``changes.py``).
        self.rebuilds = 0
        self.catch_ups = 0
        #: The pool is known to have no request awaiting approval: looked up whenever the
        #: allocator is rebuilt from the rows (as after another replica's commit), cleared by
        #: any new ask. A batch then skips looking them up (one query per batch, for a state
        #: most pools are in most of the time), and so does a call in a transaction of its own
        #: (``awaiting_requests``: one query per allocate, and per release).
        self._none_awaiting = False
        self._thread_lock = threading.RLock()
        #: Grants after which the store analyses the tables its batches address when nothing
        #: ever did (``dbutil.analyse_if_never``, once per process); None: never.
        self.analyse_after: int | None = 1000
        self._grants_asked = 0
        #: Seconds a view may lag the commits of another process deciding on the same pool.
        self.view_lag = 1.0
        self._checked = 0.0
        self._elsewhere = self._elsewhere_seen = 0
        #: Seconds between recounts of the budget hours used (see ``rebuild.used_hours``).
        self.budget_refresh = 60.0
        self._budgets_at = 0.0
        self.listeners: list[Callable[[str, dict[str, Any]], None]] = []
        #: What the pool config file declares (an API override is reset to it).
        self.file_config = file_config or PoolConfig()

    # -- reads -------------------------------------------------------------------------------

    @contextmanager
    def read(self) -> Iterator[Session]:
        """A read-only session (no pool lock; on SQLite a deferred, non-blocking BEGIN)."""
        with self.read_factory() as db:
            yield db

    @contextmanager
    def locked(self, *, fresh: bool = True) -> Iterator[Allocator]:
        """The allocator, held still (no decision runs meanwhile) for a read-only view.

        Views take no pool lock. When another process decides too, a view first catches up with
        its commits: at once with those it was told of (``commits_elsewhere``: the service's
        store process, so an answer never shows less than the decisions already answered), and
        within ``view_lag`` seconds with the rest (another replica's). ``fresh=False`` is for
        bulk readers (sample ingestion, metrics), which may be ``view_lag`` behind rather than
        rebuild the allocator for every batch of decisions.
        """
        with self._thread_lock:
            if self._allocator is None or self._check_due(fresh):
                with self.transaction(write=False):  # reads the version; rebuilds if it moved
                    pass
            assert self._allocator is not None
            yield self._allocator

    def commits_elsewhere(self) -> None:
        """Note that another process committed decisions on this pool (cheap; any thread)."""
        self._elsewhere += 1

    def _check_due(self, fresh: bool) -> bool:
        """Whether a view must look at the pool version first: told of other commits (and
        ``fresh``), or ``view_lag`` seconds since the last look."""
        now, told = time.monotonic(), self._elsewhere
        if not (fresh and told != self._elsewhere_seen) and now - self._checked < self.view_lag:
            return False
        self._checked, self._elsewhere_seen = now, told
        return True

    # -- writes ------------------------------------------------------------------------------

    def run_batch(self, batch: list[commands.Command]) -> list[Any]:
        """Run several batchable commands in ONE transaction (one lock, one commit).

        Each command's result, or its ``StoreError`` (a refusal, raised before it wrote
        anything), comes back in order. Any other error rolls the whole batch back and is
        raised: the caller fails every command of the batch, and nothing of it was committed.
        """
        results: list[Any] = []
        # no autoflush: the batch's rows go out together at commit (multi-row INSERTs)
        with (
            self.transaction(batch=True, snapshot=snapshots.released_once(batch)) as (db, _),
            db.no_autoflush,
        ):
            # on PostgreSQL the leases only a release reads came as snapshots, the rest as rows
            loaded: dict[str, Any] = db.info.pop(SNAPSHOTS, {})
            loaded |= {
                row.id: row
                for row in self._prefetch(
                    db,
                    [
                        cmd.lease_id
                        for cmd in batch
                        if isinstance(cmd, _BY_LEASE_ID) and cmd.lease_id not in loaded
                    ],
                )
            }
            db.info[_LOADED] = loaded
            allocating: set[str | None] = {
                cmd.user
                for cmd in batch
                if isinstance(cmd, commands.Allocate) and isinstance(cmd.user, str)
            }
            self._local.awaiting = self._prefetch_awaiting(
                db, set() if self._none_awaiting else allocating
            )
            try:
                for cmd in batch:
                    try:
                        results.append(dispatch.apply(self, cmd))
                    except StoreError as e:
                        results.append(e)
            finally:
                self._local.awaiting = None
        if self.analyse_after is not None:
            self._count_grants(sum(isinstance(cmd, commands.Allocate) for cmd in batch))
        return results

    def _count_grants(self, asked: int) -> None:
        """Count a committed batch's grants; at ``analyse_after`` analyse the tables a batch
        addresses if nothing ever did (``dbutil.analyse_if_never``), once."""
        assert self.analyse_after is not None
        self._grants_asked += asked
        if self._grants_asked < self.analyse_after:
            return
        self.analyse_after = None
        analysed = analyse_if_never(self.engine, _ADDRESSED_TABLES)
        if analysed:
            log.info("Analysed the pool's new tables %s", ", ".join(analysed))

    def run_solo(self, command: commands.Command) -> Any:
        """Run one command in a transaction of its own; a refusal (any ``PoolError``, which
        may come after it wrote) rolls it back and is returned instead of raised."""
        try:
            return dispatch.apply(self, command)
        except PoolError as e:
            return e

    @staticmethod
    def _prefetch(db: Session, lease_ids: list[str]) -> list[orm.LeaseRow]:
        """Load the leases (and their slots) a batch's calls address, in one query for the
        whole batch instead of one per call: ``lease_row`` then finds them without a query
        (``run_batch`` keeps them in ``Session.info``: the identity map holds rows weakly)."""
        if len(lease_ids) < 2:
            return []
        return list(
            db.scalars(
                select(orm.LeaseRow)
                .where(orm.LeaseRow.id.in_(set(lease_ids)))
                .options(joinedload(orm.LeaseRow.slots))
            ).unique()
        )

    @staticmethod
    def _prefetch_awaiting(db: Session, users: set[str | None]) -> dict[str, dict[str, str]]:
        """The requests awaiting approval of the users a batch allocates for (user → lease id
        → server), in one query for the whole batch instead of one or two per ``allocate``
        (its server's, its user's count)."""
        users.discard(None)
        if not users:
            return {}
        lease = orm.LeaseRow.__table__
        rows = db.connection().execute(
            select(lease.c.user, lease.c.id, lease.c.server).where(
                lease.c.state == "awaiting_approval", lease.c.user.in_(users)
            )
        )
        by_user: dict[str, dict[str, str]] = {}
        for user, lease_id, server in rows:
            by_user.setdefault(user, {})[lease_id] = server
        return by_user

    def note_awaiting(self, user: str, server: str, lease_id: str) -> None:
        """A request now awaits approval: in a batch, a later call finds it even once a flush
        has taken it out of the session's new rows."""
        self._none_awaiting = False
        cache = getattr(self._local, "awaiting", None)
        if cache is not None:
            cache.setdefault(user, {})[lease_id] = server

    def awaiting_requests(self, db: Session, user: str) -> dict[str, str]:
        """``user``'s requests awaiting approval now, lease id → server: those asked earlier
        in this transaction included, those an earlier call withdrew, approved or denied not.
        A batch answers from its one prefetch; a transaction of its own asks the database,
        unless no request of the pool awaits approval (``_none_awaiting``: found at the last
        rebuild, and cleared by any request that comes to await one, here or, caught up with,
        in another process): then none is, and neither the session's new rows nor its
        identity map are looked through."""
        if self._none_awaiting:  # none in the pool, and none asked since (``note_awaiting``)
            return {}
        cache = getattr(self._local, "awaiting", None)
        if cache is not None:
            known = dict(cache.get(user, {}))
        else:
            lease = orm.LeaseRow.__table__
            found = db.connection().execute(
                select(lease.c.id, lease.c.server).where(
                    lease.c.user == user, lease.c.state == "awaiting_approval"
                )
            )
            known = {lease_id: server for lease_id, server in found}
        new = [o for o in db.new if isinstance(o, orm.LeaseRow)]  # not flushed, not in the map
        known |= {o.id: o.server for o in new if (o.user, o.state) == (user, "awaiting_approval")}
        return {
            lease_id: server
            for lease_id, server in known.items()
            if (row := db.identity_map.get(db.identity_key(orm.LeaseRow, lease_id))) is None
            or row.state == "awaiting_approval"
        }

    def check_off_loop(self) -> None:
        """With ``strict_writes``: refuse to write on a thread that runs an event loop (a
        write there stalls every request for the length of a transaction)."""
        if not self.strict_writes:
            return
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        raise RuntimeError(
            "a store write ran on the event loop's thread: call it through the service's writer"
        )

    @contextmanager
    def writing(self) -> Iterator[Session]:
        """A short write transaction without the pool lock (busy hours, utilization minutes):
        rows no decision reads."""
        self.check_off_loop()
        with self.session_factory() as db, db.begin():
            yield db

    @contextmanager
    def transaction(
        self, write: bool = True, *, batch: bool = False, snapshot: list[str] | None = None
    ) -> Iterator[tuple[Session, Allocator]]:
        """Lock the pool, bring the allocator up to date, yield both; commit and bump on success.

        ``batch``: a batch of decisions (``run_batch``), which says which leases it wrote when
        it wrote nothing else (``changes.py``), so other processes need not rebuild; on
        PostgreSQL it starts in one round trip, with the leases ``snapshot`` names read as
        snapshots (``snapshots.py``; found in ``Session.info`` under ``SNAPSHOTS``).

        On any error the transaction rolls back and the in-memory allocator is thrown away (it
        may hold half-applied changes); the next transaction rebuilds it from the rows.
        """
        active = getattr(self._local, "active", None)
        if active is not None:  # inside a batch: the calls share its transaction
            yield active
            return
        if write:
            self.check_off_loop()
        with self._thread_lock, self.session_factory() as db:
            try:
                with db.begin():
                    version = None
                    if batch and write:
                        version = begin_batch(db, snapshot or [])
                    if version is None:
                        version = self._lock_version(db, write)
                    allocator = self._allocator
                    if allocator is None or self._version != version - write:
                        allocator = self._catch_up(db, version - write)
                    elif write and self._now_s() - self._budgets_at >= self.budget_refresh:
                        self._budgets_at = self._now_s()
                        allocator.quotas.used_hours = used_hours(db, allocator.quotas, self.clock())
                    self._local.active = (db, allocator)
                    events: list[dict[str, Any]] = []
                    self._local.events = events
                    if write:
                        collect_writes(db, batch=batch)
                    try:
                        yield db, allocator
                        if write:
                            self._write_out(db, version if batch else None, events)
                    finally:
                        self._local.active = None
                        self._local.events = None
                self._version = version
            except BaseException:
                self._allocator = None
                self._version = None
                raise

    @staticmethod
    def _write_out(db: Session, version: int | None, events: list[dict[str, Any]]) -> None:
        """Write what the transaction kept out of the ORM, then commit: the queued releases
        before anything else (a slot they free may be held again), the staged leases, the
        audit log in order, and for a batch (its ``version``) which leases it wrote. On
        PostgreSQL, when the ORM has nothing of its own to flush (a batch of grants and
        releases), the statements and the commit take one round trip."""
        leases = changes.touched_leases(db) if version is not None else None
        with pipelined(db) as piped:
            conn = db.connection()  # Core statements: no ORM execution path
            if conn.dialect.name == "postgresql":
                # the releases first (before the ORM's flush at commit too), then the rest
                # as one statement: new leases and slots, the audit log, the change record
                run_as_one(conn, take_released(db))
                later = take_staged(db) + event_statements(events)
                if leases is not None and version is not None:  # else other processes rebuild
                    later.append(changes.record_statement(version, leases))
                    changes.prune(db, version)
                run_as_one(conn, later)
            else:
                if leases is not None and version is not None:
                    changes.record(db, version, leases)
                if events:  # the audit log, in order
                    conn.execute(insert(table_of(orm.EventRow)), events)
            if piped:
                commit_in_pipeline(db)
        if piped:
            db.commit()  # the database committed: the session's own bookkeeping

    @staticmethod
    def _lock_version(db: Session, write: bool) -> int:
        """Serialise with every other writer and return the pool version after this transaction.

        One statement does both: a writer bumps the version row, whose row lock (held to
        commit) orders writers across replicas on PostgreSQL; a reader takes a share lock on
        it, so it never sees half of a writer's changes. (SQLite's ``BEGIN IMMEDIATE`` already
        serialised the transaction.)
        """
        table = table_of(orm.PoolState)
        stmt: Executable
        if write:
            stmt = (
                update(table)
                .where(table.c.id == 1)
                .values(version=table.c.version + 1)
                .returning(table.c.version)
            )
        else:
            read = select(table.c.version).where(table.c.id == 1)
            if db.get_bind().dialect.name == "postgresql":
                read = read.with_for_update(read=True)
            stmt = read
        conn = db.connection()  # Core statements: no need for the ORM's execution path
        version = conn.execute(stmt).scalar()
        if version is None:  # a new database: make the row once, then lock it as above
            lock_pool(db)
            if conn.execute(select(table.c.version).where(table.c.id == 1)).scalar() is None:
                conn.execute(insert(table).values(id=1, version=0))
            version = conn.execute(stmt).scalar_one()
        return int(version)

    def _catch_up(self, db: Session, version: int) -> Allocator:
        """Bring the allocator to ``version``, which another process committed: reload the
        leases it wrote when it said which, else rebuild from every row. Returns it."""
        if self._allocator is not None and self._version is not None:
            awaiting = changes.catch_up(db, self._allocator, self._version, version)
            if awaiting is not None:
                self.catch_ups += 1
                if awaiting:
                    self._none_awaiting = False
                return self._allocator
        self.rebuilds += 1
        self._allocator = allocator = self._rebuild(db)
        self._none_awaiting = none_awaiting(db)
        return allocator

    def _now_s(self) -> float:
        return self.clock().replace(tzinfo=timezone.utc).timestamp()

    def _rebuild(self, db: Session) -> Allocator:
        """The allocator from the rows (and the budget hours counted now)."""
        self._budgets_at = self._now_s()
        return build_allocator(
            db,
            self.catalog,
            self.clock(),
            aging_interval=self.aging_interval,
            reserve_after=self.reserve_after,
            dra_dynamic_mig=self.dra_dynamic_mig,
            headroom=headroom_for(self.file_config.borrowing, self.file_config.classes),
        )

    # -- the audit log -----------------------------------------------------------------------

    def _event(
        self,
        db: Session,
        kind: str,
        actor: str,
        row: orm.LeaseRow | None = None,
        data: dict[str, Any] | None = None,
    ) -> None:
        """Audit ``kind`` (written with the transaction) and tell the listeners."""
        event = {
            "ts": self.clock(),
            "actor": actor or "system",
            "kind": kind,
            "lease_id": row.id if row else None,
            "user": row.user if row else None,
            "data": data or {},
        }
        pending = getattr(self._local, "events", None)
        if pending is not None:  # written with the transaction's other events, before commit
            pending.append(event)
        else:
            db.add(orm.EventRow(**event))
        for listener in self.listeners:
            listener(kind, {"lease": row.id if row else None, **(data or {})})

    @staticmethod
    def pending_or_stored(db: Session, lease_id: str) -> orm.LeaseRow | None:
        """The lease's row, also when it was added earlier in this transaction and is not yet
        written: a batch flushes only at commit, and ``Session.get`` does not see pending rows
        (a request queued earlier in the batch and granted by a later release in it would have
        been granted in memory only)."""
        row = staged_lease(db, lease_id) or db.get(orm.LeaseRow, lease_id)
        if row is None:
            row = next(
                (o for o in db.new if isinstance(o, orm.LeaseRow) and o.id == lease_id), None
            )
        return row

    def lease_row(self, db: Session, lease_id: str) -> orm.LeaseRow:
        """The lease's row with its slots, or the ``not_found`` refusal."""
        row = (
            staged_lease(db, lease_id)
            or db.info.get(_LOADED, {}).get(lease_id)
            or db.get(orm.LeaseRow, lease_id, options=[joinedload(orm.LeaseRow.slots)])
        )
        if row is None:
            raise StoreError("not_found", f"no lease {lease_id!r}", field="id")
        return row


#: The tables a batch reads or changes by key (their plans depend on their statistics).
_ADDRESSED_TABLES = ("leases", "lease_slots", "pool_changes")

#: ``Session.info`` key of the snapshots a batch read as it started (``begin_batch``).
SNAPSHOTS = "gpupool_snapshots"

_BUMP = "UPDATE pool_state SET version = version + 1 WHERE id = 1 RETURNING version"


def begin_batch(db: Session, snapshot: list[str]) -> int | None:
    """PostgreSQL: start a batch's transaction in one round trip: its ``BEGIN``, the version
    bump (``_lock_version``) and the query of the leases ``snapshot`` names go out together,
    and the new version comes back (None elsewhere, or on a database without its version
    row yet: then the usual way).

    psycopg sends the ``BEGIN`` of a transaction on its own and waits for it; in autocommit
    mode it sends none, so the batch sends its own, in the pipeline. The connection stays in
    autocommit mode to the end of the transaction (the server is in one: the commit or the
    rollback ends it as usual) and goes back to the pool restored
    (``dbutil.restore_transactions``). Under load every round trip costs two wake-ups of
    processes sharing the cores: three of them (begin, lock, load) were a third of a batch.
    """
    conn = db.connection()
    if conn.dialect.name != "postgresql":
        return None
    raw = driver_connection(conn)
    if raw.info.transaction_status != psycopg_idle():
        return None
    raw.autocommit = True
    with driver_errors(conn, _BUMP):
        with raw.pipeline():
            raw.execute("BEGIN")
            bump = raw.execute(_BUMP)
            found = snapshots.query(raw, snapshot) if snapshot else None
        row = bump.fetchone()
        if found is not None:
            db.info[SNAPSHOTS] = snapshots.from_rows(found.fetchall())
    return None if row is None else row[0]


def none_awaiting(db: Session) -> bool:
    """Whether no request of the pool awaits approval (one indexed lookup)."""
    lease = orm.LeaseRow.__table__
    found = db.connection().execute(
        select(lease.c.id).where(lease.c.state == "awaiting_approval").limit(1)
    )
    return found.first() is None

"""Engines and migrations: SQLite (WAL, ``BEGIN IMMEDIATE``) by default, PostgreSQL in production.

Allocation transactions must serialise: on SQLite every transaction starts with ``BEGIN
IMMEDIATE`` (the write lock up front, so two writers never both read then both write); on
PostgreSQL the store's first statement locks the pool version row until commit
(``Store._lock_version``), and a transaction-scoped advisory lock (``lock_pool``) guards only
the creation of that row in a new database.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, Engine, create_engine, event, exc, inspect, text
from sqlalchemy.orm import Session

from .extras import require

if TYPE_CHECKING:
    from alembic.config import Config
    from sqlalchemy.pool import ConnectionPoolEntry

log = logging.getLogger(__name__)
ALEMBIC_DIR = Path(__file__).parent / "alembic"
#: Key of the PostgreSQL advisory lock under which a new database gets its pool version row.
POOL_LOCK_KEY = 0x6770_7570  # "gpup"


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine configured for safe concurrent allocation on either backend."""
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn: Any, _record: object) -> None:
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            if ":memory:" not in url:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Connection) -> None:
            # writers take the write lock up front; readers (WAL) never block anybody
            readonly = conn.get_execution_options().get("gpupool_readonly")
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    if url.startswith("postgresql+psycopg"):
        require("psycopg", "a PostgreSQL database URL")
    engine = create_engine(url, echo=echo, pool_size=5, max_overflow=5)
    ping_idle_connections(engine)
    restore_transactions(engine)
    return engine


#: A pooled connection idle longer than this is pinged before use (seconds).
PING_AFTER_IDLE = 10.0


def ping_idle_connections(engine: Engine, after: float = PING_AFTER_IDLE) -> None:
    """Check a pooled connection before use only when it sat idle for ``after`` seconds.

    SQLAlchemy's ``pool_pre_ping`` pings on *every* checkout: one more round trip per
    transaction, which under load is a tenth of what an allocation costs. A connection in
    steady use has just proven itself; one that sat idle may have been closed by a database
    restart or a firewall, and is replaced here before a transaction uses it. (A connection
    lost in between still fails that one transaction, which SQLAlchemy then invalidates.)
    """

    @event.listens_for(engine, "checkin")
    def _checked_in(_dbapi_conn: object, record: ConnectionPoolEntry) -> None:
        record.info["gpupool_idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _checked_out(dbapi_conn: Any, record: ConnectionPoolEntry, _proxy: object) -> None:
        since = record.info.get("gpupool_idle_since")
        if since is None or time.monotonic() - since < after:
            return
        try:
            cur = dbapi_conn.cursor()
            try:
                cur.execute("SELECT 1")
            finally:
                cur.close()
            dbapi_conn.rollback()
        except Exception as e:
            # the pool drops this connection and checks out (or opens) another
            raise exc.DisconnectionError(f"idle connection is gone: {e}") from e


def restore_transactions(engine: Engine) -> None:
    """A connection goes back to the pool in psycopg's usual mode (a ``BEGIN`` before the first
    statement of each transaction), also when a batch sent its own ``BEGIN`` in autocommit
    mode (``store.core.begin_batch``): a later transaction on it must not commit statement by
    statement."""

    @event.listens_for(engine, "checkin")
    def _restore(dbapi_conn: Any, record: ConnectionPoolEntry) -> None:
        if dbapi_conn is None or not getattr(dbapi_conn, "autocommit", False):
            return
        try:
            dbapi_conn.autocommit = False  # idle: SQLAlchemy's reset rolled back what was open
        except Exception as e:  # never reused as it is: the pool opens another
            record.invalidate(e)


def analyse_if_never(engine: Engine, tables: tuple[str, ...]) -> list[str]:
    """PostgreSQL: ``ANALYZE`` those of ``tables`` that were never analysed (by hand or by
    autovacuum); returns their names. PostgreSQL's advice after loading a table ("Populating a
    Database": run ``ANALYZE`` afterwards), for a pool whose tables grow from empty.

    Why: a prepared statement's generic plan is made in a connection's first seconds and kept
    until the table's statistics change. Made while ``leases`` held a few rows, it scans the
    whole table for a batch's 8 leases (``EXPLAIN``: a hash join over all 5,668 leases and
    slots for 9 of each), and keeps scanning as the table grows, until autovacuum's first
    ``ANALYZE`` (its naptime is a minute) invalidates it: 2–3x the database's CPU per grant in a
    new pool's first minute of load. Errors are logged, never raised (it only helps the planner).
    """
    if engine.dialect.name != "postgresql":
        return []
    try:
        with engine.connect() as conn:
            conn = conn.execution_options(isolation_level="AUTOCOMMIT")
            never = (
                conn.execute(
                    text(
                        "SELECT relname FROM pg_stat_user_tables WHERE relname = ANY(:tables) "
                        "AND last_analyze IS NULL AND last_autoanalyze IS NULL ORDER BY relname"
                    ),
                    {"tables": list(tables)},
                )
                .scalars()
                .all()
            )
            if never:
                quote = engine.dialect.identifier_preparer.quote
                conn.exec_driver_sql("ANALYZE " + ", ".join(quote(t) for t in never))
            return list(never)
    except exc.SQLAlchemyError as e:
        log.warning("Could not analyse the pool's new tables: %s", e)
        return []


def lock_pool(db: Session) -> None:
    """Serialise with other transactions that take it, until commit (PostgreSQL): a new
    database's first writers, creating its pool version row."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": POOL_LOCK_KEY})


#: Key of the session-level advisory lock that elects the replica running background loops.
LEADER_LOCK_KEY = 0x6770_756C  # "gpul"


class LeaderLock:
    """Which replica runs the background loops (expiry, queue promotion, telemetry flushes).

    On PostgreSQL a session-level advisory lock held on a dedicated connection: the first replica
    to take it leads until its connection ends (crash included), then another takes over. On
    SQLite there is one replica per database file, so it always leads.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._conn: Connection | None = None
        self._leading = False

    def held(self) -> bool:
        """Whether this process leads now (tries to become leader when it does not)."""
        if self.engine.dialect.name != "postgresql":
            return True
        try:
            if self._conn is None:
                self._conn = self.engine.connect()
            if self._leading:
                self._conn.execute(text("SELECT 1"))  # still connected, so still holding it
            else:
                self._leading = bool(
                    self._conn.execute(
                        text("SELECT pg_try_advisory_lock(:k)"), {"k": LEADER_LOCK_KEY}
                    ).scalar()
                )
            self._conn.commit()
            return self._leading
        except Exception:  # connection lost: we no longer hold anything
            self.release()
            return False

    def release(self) -> None:
        """Give up leadership (closing the connection drops the lock)."""
        self._leading = False
        if self._conn is not None:
            try:
                self._conn.invalidate()  # really close it (a pooled one would keep the lock)
                self._conn.close()
            finally:
                self._conn = None


def alembic_config(url: str) -> Config:
    """An Alembic config pointing at our migrations and ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (creates it when empty).

    Unlocked: for the one process that knows it is alone (tests, a fresh file). Services and
    ``upgrade-db`` call :func:`migrate`, which serialises with every other migrator.
    """
    from alembic import command

    command.upgrade(alembic_config(url), revision)


#: Key of the session-level advisory lock every migrator of a PostgreSQL pool database takes.
MIGRATE_LOCK_KEY = 0x6770_756D  # "gpum"


def migrate(
    url: str, log: logging.Logger | logging.LoggerAdapter[logging.Logger] = log
) -> tuple[str | None, str | None]:
    """Bring the database at ``url`` to the newest revision, one migrator at a time.

    Replicas starting together on an old schema, and an ``upgrade-db`` Job beside them, must
    not run the same migration twice at once. On PostgreSQL a session-level advisory lock,
    held on the connection the migration runs through, serialises them; on a SQLite file an
    exclusive ``flock`` on ``<file>.migrate-lock`` does. Whoever gets the lock second finds
    the schema current and changes nothing. Returns the revision found under the lock and the
    one left (equal when nothing ran).
    """
    from alembic import command

    engine = make_engine(url)
    head = head_revision()
    try:
        with _migration_lock(engine) as conn:
            before = _revision_of(conn)
            if before != head:
                log.info("Migrating the pool database from %s to %s", before or "empty", head)
                cfg = alembic_config(url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
                conn.commit()
                log.info("The pool database is at %s", head)
            return before, _revision_of(conn)
    finally:
        engine.dispose()


def _revision_of(conn: Connection) -> str | None:
    if "alembic_version" not in inspect(conn).get_table_names():
        return None
    found = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    conn.commit()
    return found


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Iterator[Connection]:
    """A connection holding the pool's migration lock (see :func:`migrate`)."""
    path = engine.url.database if engine.dialect.name == "sqlite" else None
    with contextlib.ExitStack() as stack:
        if path and path != ":memory:":
            import fcntl

            lock_file = stack.enter_context(open(f"{path}.migrate-lock", "a"))
            fcntl.flock(lock_file, fcntl.LOCK_EX)
        conn = stack.enter_context(engine.connect())
        if engine.dialect.name == "postgresql":
            conn.execute(text("SELECT pg_advisory_lock(:k)"), {"k": MIGRATE_LOCK_KEY})
            conn.commit()
            stack.callback(_unlock, conn)
        yield conn


def _unlock(conn: Connection) -> None:
    with contextlib.suppress(exc.SQLAlchemyError):
        conn.rollback()
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": MIGRATE_LOCK_KEY})
        conn.commit()


class SchemaError(Exception):
    """The database's schema is not one this version can run on (the message says why)."""


def prepare_schema(
    engine: Engine,
    url: str,
    *,
    upgrade: bool,
    wait: float,
    log: logging.Logger | logging.LoggerAdapter[logging.Logger] = log,
    sleep: Callable[[float], None] = time.sleep,
) -> None:
    """At a service's start: create a new database, migrate an old one (``upgrade``) or wait
    for somebody else to.

    Creating and migrating take the migration lock (:func:`migrate`): of replicas starting
    together, one runs the migration and the others find it done. Without ``upgrade`` an old
    schema is somebody else's to migrate (the Helm chart's hook Job, an admin's
    ``upgrade-db``): the service waits up to ``wait`` seconds for it, saying so every 10 s,
    rather than running a long migration its startup probe could cut short.
    """
    head = head_revision()
    revision = current_revision(engine)
    if revision is None or (revision != head and upgrade):
        before, after = migrate(url, log)
        if before == after:
            log.info("The pool database is at %s (migrated by another process)", after)
        return
    if revision == head:
        return
    if not known_revision(revision):
        raise SchemaError(
            f"The pool database is at revision {revision}, which this version does not know: "
            "a newer jupyterhub-gpupool migrated it."
        )
    deadline = time.monotonic() + wait
    while revision != head:
        left = deadline - time.monotonic()
        if left <= 0:
            raise SchemaError(
                f"The pool database is at revision {revision}, this version needs {head}: "
                "run `jupyterhub-gpupool upgrade-db --db-url ...` (or start the service with "
                "--upgrade-db)."
            )
        log.warning(
            "Waiting for the pool database to be migrated from %s to %s (run "
            "`jupyterhub-gpupool upgrade-db`); giving up in %.0f s",
            revision,
            head,
            left,
        )
        sleep(min(10.0, left))
        revision = current_revision(engine)
    log.info("The pool database is at %s", head)


def known_revision(revision: str) -> bool:
    """Whether ``revision`` is one of this version's migrations (else a newer version wrote
    the database)."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    try:
        return script.get_revision(revision) is not None
    except Exception:  # alembic raises its own CommandError / ResolutionError kinds
        return False


def current_revision(engine: Engine) -> str | None:
    """The Alembic revision the database is at, or None when it has no tables yet."""
    if "alembic_version" not in inspect(engine).get_table_names():
        return None
    with engine.connect() as conn:
        return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def head_revision() -> str:
    """The newest migration shipped with this version."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head() or ""

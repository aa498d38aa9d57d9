"""Engines and migrations: SQLite (WAL, ``BEGIN IMMEDIATE``) by default, PostgreSQL in production.

Allocation transactions must serialise: on SQLite every transaction starts with ``BEGIN
IMMEDIATE`` (the write lock up front, so two writers never both read then both write); on
PostgreSQL the store takes a transaction-scoped advisory lock (``lock_pool``).
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Engine, create_engine, event, inspect, text
from sqlalchemy.orm import Session

ALEMBIC_DIR = Path(__file__).parent / "alembic"
#: Key of the PostgreSQL advisory lock that serialises allocation decisions across replicas.
POOL_LOCK_KEY = 0x6770_7570  # "gpup"


def make_engine(url: str, *, echo: bool = False) -> Engine:
    """An engine configured for safe concurrent allocation on either backend."""
    if url.startswith("sqlite"):
        engine = create_engine(url, echo=echo, connect_args={"timeout": 30})

        @event.listens_for(engine, "connect")
        def _sqlite_connect(dbapi_conn, _record) -> None:  # noqa: ANN001
            dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
            cur = dbapi_conn.cursor()
            if ":memory:" not in url:
                cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn) -> None:  # noqa: ANN001
            # writers take the write lock up front; readers (WAL) never block anybody
            readonly = conn.get_execution_options().get("gpupool_readonly")
            conn.exec_driver_sql("BEGIN" if readonly else "BEGIN IMMEDIATE")

        return engine
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url, echo=echo, pool_pre_ping=True, pool_size=5, max_overflow=5)


def lock_pool(db: Session) -> None:
    """Serialise allocation decisions for the rest of this transaction (PostgreSQL)."""
    if db.get_bind().dialect.name == "postgresql":
        db.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": POOL_LOCK_KEY})


def alembic_config(url: str):
    """An Alembic config pointing at our migrations and ``url``."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(ALEMBIC_DIR))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    """Bring the database at ``url`` to ``revision`` (creates it when empty)."""
    from alembic import command

    command.upgrade(alembic_config(url), revision)


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

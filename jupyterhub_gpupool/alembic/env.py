"""Alembic environment: runs our migrations against the URL the caller configured."""

from alembic import context
from sqlalchemy import Connection

from jupyterhub_gpupool.dbutil import make_engine
from jupyterhub_gpupool.orm import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Migrate through a real connection (SQLite batch mode for ALTERs): the caller's, when
    it passes one (``dbutil.migrate`` holds the migration lock on it), else a new one."""
    given = config.attributes.get("connection")
    if given is not None:
        _run(given)
        return
    url = config.get_main_option("sqlalchemy.url")
    if url is None:
        raise RuntimeError("no sqlalchemy.url: migrate through jupyterhub_gpupool.dbutil.migrate")
    engine = make_engine(url)
    with engine.connect() as connection:
        _run(connection)
        connection.commit()
    engine.dispose()


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()

"""Alembic environment: runs our migrations against the URL the caller configured."""

from alembic import context

from jupyterhub_gpupool.dbutil import make_engine
from jupyterhub_gpupool.orm import Base

config = context.config
target_metadata = Base.metadata


def run_migrations_online() -> None:
    """Migrate through a real connection (SQLite batch mode for ALTERs)."""
    url = config.get_main_option("sqlalchemy.url")
    engine = make_engine(url)
    with engine.connect() as connection:
        context.configure(
            connection=connection,
            target_metadata=target_metadata,
            render_as_batch=connection.dialect.name == "sqlite",
        )
        with context.begin_transaction():
            context.run_migrations()
        connection.commit()
    engine.dispose()


run_migrations_online()

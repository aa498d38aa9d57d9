"""Pooled PostgreSQL connections are pinged only after sitting idle, and replaced if gone."""

from types import SimpleNamespace

import psycopg
import pytest
from sqlalchemy import create_engine, exc, text

from jupyterhub_gpupool import dbutil
from jupyterhub_gpupool.dbutil import ping_idle_connections
from tests.fakes import SecondsClock


def _engine(pg_url: str, after: float):
    """An engine whose every statement, pings included, is counted at the driver."""
    sent: list[str] = []

    class Counting(psycopg.Cursor):
        def execute(self, query, *args, **kwargs):
            sent.append(str(query))
            return super().execute(query, *args, **kwargs)

    engine = create_engine(
        pg_url.replace("postgresql://", "postgresql+psycopg://"),
        pool_size=1,
        connect_args={"cursor_factory": Counting},
    )
    ping_idle_connections(engine, after=after)
    return engine, sent


def _kill_backend(pg_url: str, engine) -> None:
    with engine.connect() as c:
        pid = c.execute(text("SELECT pg_backend_pid()")).scalar()
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


@pytest.fixture
def idle_clock(monkeypatch) -> SecondsClock:
    """The clock the idle check reads (``time.monotonic`` in dbutil), moved by the test."""
    clock = SecondsClock(0.0)
    monkeypatch.setattr(dbutil, "time", SimpleNamespace(monotonic=clock))
    return clock


def test_an_idle_connection_the_server_closed_is_replaced(pg_url, idle_clock):
    engine, sent = _engine(pg_url, after=0.05)
    _kill_backend(pg_url, engine)  # e.g. the database restarted while the pool sat idle
    idle_clock.advance(0.1)
    sent.clear()
    with engine.connect() as c:
        assert c.execute(text("SELECT 41 + 1")).scalar() == 42
    assert sent[0] == "SELECT 1"  # the ping found it gone; the query ran on a new connection
    engine.dispose()


def test_a_connection_in_steady_use_is_not_pinged(pg_url):
    engine, sent = _engine(pg_url, after=60.0)
    with engine.connect() as c:
        c.execute(text("SELECT 1 + 1"))  # the first connection (and dialect set-up)
    sent.clear()
    for _ in range(5):
        with engine.connect() as c:
            c.execute(text("SELECT 2"))
    # the pool's checkouts cost no extra statement (pool_pre_ping would send one each)
    assert sent == ["SELECT 2"] * 5
    # and a connection lost in between fails its transaction once, then the pool recovers
    _kill_backend(pg_url, engine)
    with pytest.raises(exc.OperationalError), engine.connect() as c:
        c.execute(text("SELECT 3"))
    with engine.connect() as c:
        assert c.execute(text("SELECT 4")).scalar() == 4
    engine.dispose()

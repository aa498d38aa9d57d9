"""One replica leads the background loops; another takes over when its connection ends."""

from jupyterhub_gpupool.dbutil import LeaderLock, make_engine
from tests.fakes import wait_until


def test_one_leader_on_postgresql_and_takeover(pg_url):
    first, second = LeaderLock(make_engine(pg_url)), LeaderLock(make_engine(pg_url))
    assert first.held()
    assert first.held()  # stays leader
    assert not second.held()
    first.release()  # e.g. the leading replica died: its session and lock are gone
    # the server drops the lock once it has seen the connection close, which a loaded
    # machine may take a moment to do
    assert wait_until(second.held, what="the second replica to take over the lead")
    assert not first.held()
    second.release()


def test_sqlite_always_leads(sqlite_url):
    assert LeaderLock(make_engine(sqlite_url)).held()

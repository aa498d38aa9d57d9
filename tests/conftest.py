"""Shared fixtures: a fresh PostgreSQL database per test, a real hub + pool service."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from jupyterhub_gpupool.data import data_path
from jupyterhub_gpupool.store.core import STRICT_WRITES_ENV

PG_ADMIN_URL = os.environ.get("GPUPOOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

#: The hub fixtures' services run their housekeeping every second (not every 15 s), so the
#: reconcile at start that the hub was not up for comes soon and the fixtures can wait for it
#: (``wait_reconciled``) before a test makes leases of servers the hub does not know.
RECONCILE_SOON = "--PoolService.housekeeping_interval=1"

# Every store write in the test run, here and in every service process the tests start (they
# inherit the environment), checks that it runs off the event loop: a handler or loop that
# writes directly instead of through the service's writer fails its test.
os.environ[STRICT_WRITES_ENV] = "1"


@pytest.fixture
def pg_url() -> Iterator[str]:
    """A new, empty PostgreSQL database, dropped afterwards."""
    import psycopg

    name = f"gpupool_{uuid.uuid4().hex[:10]}"
    admin = PG_ADMIN_URL.replace("postgresql://", "postgresql://", 1)
    try:
        conn = psycopg.connect(admin, autocommit=True)
    except psycopg.OperationalError as e:
        pytest.fail(f"PostgreSQL is needed at {PG_ADMIN_URL} (set GPUPOOL_TEST_PG): {e}")
    with conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base = admin.rsplit("/", 1)[0]
    yield f"{base}/{name}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """A new SQLite database file."""
    return f"sqlite:///{tmp_path}/pool.sqlite"


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each backend in turn."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/pool.sqlite"
    return request.getfixturevalue("pg_url")


@pytest.fixture
def demo_pool_file() -> Path:
    """The shipped demo pool config."""
    return data_path("demo-pool.yaml")


@pytest.fixture
def sim_env(tmp_path: Path, sqlite_url: str, demo_pool_file: Path):
    """A running hub and pool service (SQLite, demo pool) reading the demo pool's simulated GPUs
    itself (``telemetry_source = sim``): samples every 0.2 s, utilization minutes flushed every
    0.5 s."""
    from tests.fakes import HubEnv, wait_reconciled

    args = (
        "--PoolService.telemetry_source=sim",
        "--PoolService.sample_interval=0.2",
        "--PoolService.utilization_flush_interval=0.5",
        RECONCILE_SOON,
    )
    with HubEnv(tmp_path, sqlite_url, demo_pool_file, service_args=args).running() as env:
        wait_reconciled(env)
        yield env


@pytest.fixture(params=["thread", "process"])
def hub_env(request: pytest.FixtureRequest, tmp_path: Path, sqlite_url: str, demo_pool_file: Path):
    """A running hub and pool service (SQLite, demo pool); stopped afterwards. Once with the
    decisions in a thread of the service, once in its store process."""
    from tests.fakes import HubEnv, wait_reconciled

    args = (f"--PoolService.decisions={request.param}", RECONCILE_SOON)
    with HubEnv(tmp_path, sqlite_url, demo_pool_file, service_args=args).running() as env:
        wait_reconciled(env)
        yield env

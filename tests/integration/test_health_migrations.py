"""Start-up as production runs it: migrations once under a lock, services that wait for the
schema instead of migrating, and a health endpoint that tells a wedged writer from an open port.

Every service here is a real ``jupyterhub-gpupool service`` process (no hub: it starts without
one and reconciles later); the databases are real PostgreSQL and SQLite files.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import psycopg
import pytest
from alembic.script import ScriptDirectory

from jupyterhub_gpupool.dbutil import (
    MIGRATE_LOCK_KEY,
    alembic_config,
    current_revision,
    head_revision,
    make_engine,
    migrate,
    upgrade,
)
from tests.fakes import free_port, request, wait_until

pytestmark = pytest.mark.slow


def previous_revision() -> str:
    """The migration before the newest: a database one upgrade behind this version."""
    script = ScriptDirectory.from_config(alembic_config("sqlite://"))
    head = script.get_revision(head_revision())
    assert head is not None and isinstance(head.down_revision, str)
    return head.down_revision


SERVICE = (sys.executable, "-m", "jupyterhub_gpupool.cli", "service")


class Service:
    """One ``jupyterhub-gpupool service`` process on ``db_url``."""

    def __init__(self, where: Path, db_url: str, *args: str, name: str = "svc") -> None:
        self.port = free_port()
        self.log = where / f"{name}.log"
        env = {
            **os.environ,
            "JUPYTERHUB_API_TOKEN": "not-a-hub-token",
            "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.port}",
            # no hub answers here: the service starts anyway and reconciles later
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
        }
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [*SERVICE, f"--db-url={db_url}", "--log-level=INFO", *args],
                cwd=where,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def health_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/gpupool/health"

    def health(self) -> tuple[int, dict]:
        """The health endpoint's status and body (0 while nothing answers)."""
        try:
            r = request("GET", self.health_url, None)
        except OSError:
            return 0, {}
        return r.status, r.json() if r.status in (200, 503) else {}

    def wait_healthy(self, timeout: float = 90) -> None:
        wait_until(
            lambda: self.health()[0] == 200 or self.proc.poll() is not None,
            timeout,
            "the service never answered its health check",
            step=0.2,
            info=self.text,
        )
        assert self.proc.poll() is None, self.text()

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        return self.proc.wait(60)


def test_two_services_on_an_old_schema_migrate_once(pg_url, tmp_path):
    """Replicas started together on a schema one migration behind: exactly one migrates
    (the other waits on the lock and finds it done), both come up healthy."""
    upgrade(pg_url, previous_revision())
    # the test holds the migration lock until both services wait for it: then they surely
    # meet at the lock, whatever the machine's speed
    holder = psycopg.connect(pg_url, autocommit=True)
    holder.execute("SELECT pg_advisory_lock(%s)", (MIGRATE_LOCK_KEY,))
    a = Service(tmp_path, pg_url, "--upgrade-db", name="a")
    b = Service(tmp_path, pg_url, "--upgrade-db", name="b")
    try:
        wait_until(lambda: waiting_for_lock(holder) == 2, 90, "both services waiting for the lock")
        holder.execute("SELECT pg_advisory_unlock(%s)", (MIGRATE_LOCK_KEY,))
        a.wait_healthy()
        b.wait_healthy()
        logs = a.text() + b.text()
        assert logs.count("Migrating the pool database from") == 1, logs
        assert "migrated by another process" in logs
        assert current_revision(make_engine(pg_url)) == head_revision()
    finally:
        holder.close()
        assert a.stop() == 0 and b.stop() == 0


def waiting_for_lock(conn: psycopg.Connection) -> int:
    """Sessions waiting for the migration lock (an advisory lock on one bigint key)."""
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        " AND classid = 0 AND objid = %s",
        (MIGRATE_LOCK_KEY,),
    ).fetchone()
    return row[0] if row else 0


def test_concurrent_migrators_run_each_migration_once(pg_url):
    """``migrate`` from several threads at once (services and an upgrade-db Job): one runs
    the migration, every other one finds the schema current."""
    upgrade(pg_url, previous_revision())
    results: list[tuple[str | None, str | None]] = []
    start = threading.Barrier(4)

    def run() -> None:
        start.wait()
        results.append(migrate(pg_url))

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    head = head_revision()
    assert sorted(results, key=str) == sorted(
        [(previous_revision(), head)] + [(head, head)] * 3, key=str
    )


def test_a_service_waits_for_upgrade_db_instead_of_migrating(pg_url, tmp_path):
    """Without --upgrade-db (the chart's pods), an old schema is the hook Job's to migrate:
    the service says what it waits for, and comes up once ``upgrade-db`` has run."""
    upgrade(pg_url, previous_revision())
    svc = Service(tmp_path, pg_url, "--PoolService.schema_wait=300")
    try:
        wait_until(lambda: "Waiting for the pool database" in svc.text(), 60, "no waiting line")
        assert svc.health()[0] == 0  # not listening while the schema is behind
        assert current_revision(make_engine(pg_url)) == previous_revision()  # it did not migrate
        done = subprocess.run(
            [sys.executable, "-m", "jupyterhub_gpupool.cli", "upgrade-db"],
            env={**os.environ, "GPUPOOL_DB_URL": pg_url},
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        assert f"pool database at {head_revision()} (was {previous_revision()})" in done.stdout
        svc.wait_healthy()
        again = subprocess.run(
            [sys.executable, "-m", "jupyterhub_gpupool.cli", "upgrade-db", f"--db-url={pg_url}"],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode == 0 and "nothing to migrate" in again.stdout
    finally:
        assert svc.stop() == 0


def test_a_service_that_waited_long_enough_exits_with_one_line(sqlite_url, tmp_path):
    upgrade(sqlite_url, previous_revision())
    svc = Service(tmp_path, sqlite_url, "--PoolService.schema_wait=0")
    assert svc.proc.wait(60) != 0
    assert "run `jupyterhub-gpupool upgrade-db" in svc.text()
    assert "Traceback" not in svc.text()
    assert current_revision(make_engine(sqlite_url)) == previous_revision()


def test_health_fails_while_the_writer_is_wedged(tmp_path):
    """A writer stuck on the database (another process holds SQLite's write lock) keeps the
    port open and reads answering; the health check says 503 until it moves again."""
    db = tmp_path / "pool.sqlite"
    url = f"sqlite:///{db}"
    svc = Service(
        tmp_path,
        url,
        "--PoolService.health_stall_after=1",
        "--PoolService.housekeeping_interval=0.5",  # its writes find the lock taken
    )
    try:
        svc.wait_healthy()
        body = svc.health()[1]
        assert body["writer"] == {"ok": True, "outstanding": 0, "stalled_seconds": 0.0}
        holder = sqlite3.connect(db, timeout=30, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")  # the write lock, held (the writer waits up to 30 s)
        try:
            wait_until(lambda: svc.health()[0] == 503, 25, "health never noticed the writer")
            body = svc.health()[1]
            assert body["status"] == "unhealthy" and not body["writer"]["ok"], body
            assert body["writer"]["outstanding"] >= 1 and body["writer"]["stalled_seconds"] > 1
            assert body["loop"]["ok"]  # the loop itself is fine: it answered
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        wait_until(lambda: svc.health()[0] == 200, 60, "health never recovered")
    finally:
        assert svc.stop() == 0


def test_health_needs_no_token_and_says_nothing_else(sqlite_url, tmp_path):
    svc = Service(tmp_path, sqlite_url)
    try:
        svc.wait_healthy()
        r = request("GET", svc.health_url, None)
        assert r.status == 200 and r.headers["Cache-Control"] == "no-store"
        assert set(r.json()) == {"status", "loop", "writer", "stall_after_seconds"}
    finally:
        assert svc.stop() == 0

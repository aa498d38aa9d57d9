"""The database goes away under load and comes back: the service answers 503
``store_unavailable`` meanwhile (never a 500, never a hang), recovers by itself, and loses no
acknowledged change nor grants a GPU twice.

The test runs its own PostgreSQL cluster (Debian's ``initdb``/``pg_ctl``, a private folder and
port), so stopping it touches nobody else's database. Clients are threads looping allocate →
release through the real service (decisions in its store process, as on PostgreSQL by
default); the outage lasts ten seconds of wall time, and every wait for an effect has a
generous bound.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fakes import HubEnv, free_port, request, wait_until, write_pool

POOL = """
nodes:
  - name: node-a
    gpus: [{model: H100-80GB, count: 4}]
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
quotas:
  default: {guarantee: 1, limit: 1}
"""
CLIENTS = 4
OUTAGE = 10.0


def _pg_bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for folder in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (folder / name).exists():
            return str(folder / name)
    return None


class Cluster:
    """A private PostgreSQL cluster: ``initdb`` once, then ``stop``/``start`` at will."""

    def __init__(self, where: Path) -> None:
        self.where = where
        self.data = where / "data"
        self.port = free_port()
        self.initdb, self.pg_ctl = _pg_bin("initdb"), _pg_bin("pg_ctl")
        # the server refuses to run as root: run it as the postgres user where we are root
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, timeout=120)

    def create(self) -> None:
        self.where.mkdir(parents=True, exist_ok=True)
        if self.as_user:
            shutil.chown(self.where, "postgres")
        self._run(self.initdb, "-D", str(self.data), "-A", "trust", "-U", "postgres", "--no-sync")
        self.start()

    def start(self) -> None:
        opts = f"-p {self.port} -k {self.where} -c listen_addresses=127.0.0.1 -c fsync=off"
        self._run(self.pg_ctl, "-D", str(self.data), "-o", opts, "-l", str(self.where / "pg.log"),
                  "-w", "start")  # fmt: skip

    def stop(self) -> None:
        self._run(self.pg_ctl, "-D", str(self.data), "-m", "fast", "-w", "stop")


@pytest.fixture
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    where = Path("/tmp") / f"gpupool-pg-{os.getpid()}-{free_port()}"  # short: socket paths
    pg = Cluster(where)
    if pg.initdb is None or pg.pg_ctl is None:
        pytest.skip("no initdb/pg_ctl on this machine (Debian's postgresql package has them)")
    if pg.as_user and shutil.which("runuser") is None:
        pytest.skip("running as root without runuser: cannot start a private PostgreSQL")
    pg.create()
    try:
        yield pg
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # already stopped
            pg.stop()
        shutil.rmtree(where, ignore_errors=True)


def test_the_database_stops_for_ten_seconds_and_nothing_is_lost(tmp_path, cluster):
    env = HubEnv(
        tmp_path,
        cluster.url,
        write_pool(tmp_path, POOL),
        users=(*(f"u{i}" for i in range(CLIENTS)), "admin"),
        service_args=(
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
        ),
    )
    with env.running():
        api, spawner = env.api, env.spawner_token
        answered: list[tuple[float, str, int, str]] = []  # (time, op, status, code or lease)
        granted: set[str] = set()
        released: set[str] = set()
        stop = threading.Event()

        def client(i: int) -> None:
            n = 0
            while not stop.is_set():
                n += 1
                body = {"user": f"u{i}", "server": f"s{n}", "offer": "h100"}
                r = request("POST", f"{api}/allocations", spawner, body)
                code = r.json()["error"]["code"] if r.status >= 400 else r.json()["id"]
                answered.append((time.monotonic(), "POST", r.status, code))
                if r.status != 201:
                    time.sleep(0.05)  # pacing while the store is away, not a bound
                    continue
                granted.add(code)
                while not stop.is_set():  # release it, however long the store is away
                    d = request("DELETE", f"{api}/allocations/{code}", spawner)
                    why = d.json()["error"]["code"] if d.status >= 400 else ""
                    answered.append((time.monotonic(), "DELETE", d.status, why))
                    if d.status == 200:
                        released.add(code)
                        break
                    time.sleep(0.05)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        wait_until(lambda: len(granted) >= 20, what="the first grants under load", info=env.logs)
        cluster.stop()
        down = time.monotonic()
        wait_until(
            lambda: any(t > down and s == 503 for t, _, s, _ in answered),
            what="a 503 while the database is down",
            info=env.logs,
        )
        time.sleep(OUTAGE)  # the outage itself: wall time by design, nothing waits on it
        cluster.start()
        up = time.monotonic()
        before = len(granted)
        wait_until(
            lambda: len(granted) >= before + 20,
            120,
            "grants again after the restart",
            info=env.logs,
        )
        stop.set()
        for t in threads:
            t.join(60)

        during = [(s, c) for t, op, s, c in answered if down < t < up]
        statuses = Counter(s for s, _ in during)
        assert statuses[503] > 0, statuses
        assert set(statuses) <= {201, 200, 503}, statuses  # no 500, nothing else
        codes = Counter(c for s, c in during if s >= 400)
        assert set(codes) <= {"store_unavailable", "store_restarting"}, codes
        assert codes["store_unavailable"] > 0, codes
        assert not any(s >= 500 and s != 503 for _, _, s, _ in answered)

        # nothing acknowledged was lost: every granted lease exists, every release stuck
        admin = env.token("admin")
        for lease_id in granted:
            r = request("GET", f"{api}/allocations/{lease_id}", admin)
            assert r.status == 200, (lease_id, r.body)
            if lease_id in released:
                assert r.json()["state"] == "released", r.body
        # no GPU held twice, and what is still held is what the clients did not release
        items = request("GET", f"{api}/allocations?limit=1000&state=granted", admin).json()
        live = items["items"]
        slots = Counter(s["gpu"] for le in live for s in le["slots"])
        assert all(n == 1 for n in slots.values()), slots
        # (a live lease no client saw granted is one whose answer was lost: allowed)
        assert not {le["id"] for le in live} & released
        assert request("GET", f"{api}/pool", admin).status == 200


def test_a_node_whose_agent_goes_silent_is_unreachable_until_it_reports_again(tmp_path):
    env = HubEnv(
        tmp_path,
        f"sqlite:///{tmp_path}/pool.sqlite",
        write_pool(tmp_path, POOL),
        service_args=(
            "--PoolService.agent_timeout=2",
            "--PoolService.housekeeping_interval=0.5",
            "--PoolService.reconcile_on_start=False",
            "--PoolService.reconcile_interval=0",
        ),
    )
    with env.running():
        admin, pool_file = env.token("admin"), write_pool(tmp_path, POOL)
        metrics_url = env.api.replace("/api/v1", "/metrics")

        def node() -> dict:
            pool = request("GET", f"{env.api}/pool", admin).json()
            return next(n for c in pool["clusters"] for n in c["nodes"] if n["name"] == "node-a")

        def gauge() -> str:
            text = request("GET", metrics_url, admin).body.decode()
            return next(ln for ln in text.splitlines() if ln.startswith("gpupool_node_unreachable"))

        def reported() -> bool:
            events = request("GET", f"{env.api}/events?limit=1000", admin).json()["items"]
            return any(e["kind"] == "inventory" for e in events)

        agent = env.start_agent("node-a", pool_file, 0.2)
        try:
            wait_until(reported, 60, "the agent's inventory", info=lambda: _output(agent))
            body = {"user": "alice", "server": "", "offer": "h100"}
            held = request("POST", f"{env.api}/allocations", env.spawner_token, body).json()
            assert held["state"] == "granted"
        finally:
            agent.terminate()
            agent.communicate(timeout=30)
        # silent now: after agent_timeout the node is unreachable, its lease stays
        wait_until(lambda: node()["unreachable"], 60, "the node marked unreachable", info=env.logs)
        assert gauge().endswith(" 1.0"), gauge()
        lease = request("GET", f"{env.api}/allocations/{held['id']}", admin).json()
        assert lease["state"] == "granted"
        body = {"user": "bob", "server": "", "offer": "h100"}
        waiting = request("POST", f"{env.api}/allocations", env.spawner_token, body).json()
        assert waiting["state"] == "queued"  # no new grants on an unreachable node
        # the agent is back: the node takes grants again and bob is served
        agent = env.start_agent("node-a", pool_file, 0.2)
        try:

            def bob() -> str:
                url = f"{env.api}/allocations/{waiting['id']}"
                return request("GET", url, admin).json()["state"]

            wait_until(lambda: bob() == "granted", 60, "bob granted once the agent is back")
            assert not node()["unreachable"] and gauge().endswith(" 0.0")
        finally:
            agent.terminate()
            agent.communicate(timeout=30)


def _output(proc: subprocess.Popen) -> str:
    """What a finished (or killed) agent printed."""
    if proc.poll() is None:
        proc.terminate()
    out, _ = proc.communicate(timeout=30)
    return out or ""

"""Idle-GPU reclamation end to end: a real JupyterHub, real single-user servers with real kernels,
the pool service as a process, simulated GPUs, and the reclaimer's core driven round by round.

Everything that tells time reads the test's clock (:class:`~tests.fakes.ClockFile`): the pool's
store, the simulated NVML and the samples' timestamps, and the reclaimer. A round is one window
of ``WINDOW`` seconds of that clock, with GPU samples every ``STEP`` seconds, so an hour of
idleness takes a few real seconds and no test waits for time to pass. What the hub and the
servers stamp on their own is older than every window (the clock runs ahead of the real one):
presence comes only from the activity the test posts, and a kernel is busy only while a real
cell runs in it.

The three sources are real: the GPU is the simulated NVML's (a whole H100 busy or idle by its
load; an A100 MIG instance with a process holding memory cannot say), the kernel is a real
ipykernel behind jupyter-server (``execution_state`` busy while a cell runs; *unknown* where the
hub refuses the reclaimer's token for that user's server), and presence is the hub's activity
and the open kernel sockets.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from jupyterhub_gpupool.pool.idlesignal import CASES, Case, classify
from tests.fakes import (
    SPAWNER_CONFIG,
    ClockFile,
    HubEnv,
    KernelDriver,
    SimAgent,
    clocked_service_python,
    request,
    wait_reconciled,
    wait_until,
    write_pool,
)

pytestmark = pytest.mark.e2e

POOL = """
nodes:
  - name: node-h100
    gpus: [{model: H100-80GB, count: 4}]
  - name: node-h100s
    gpus: [{model: H100-80GB, count: 1, sharing: shared}]
  - name: node-a100
    gpus:
      - model: A100-80GB
        mig:
          enabled: true
          instances: [{profile: 3g.40gb, start: 0}, {profile: 3g.40gb, start: 4}]
offers:
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
  - {name: h100-half, kind: shared, fraction: 0.5, models: [H100-80GB]}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB]}
quotas:
  default: {guarantee: 1, limit: 3}
reclaim:
  default: {policy}
"""
#: the pool config's reclaim policy (minutes, so a round of the test's clock is a minute)
POLICY: dict[str, Any] = {
    "idle_timeout": "5m",
    "pressure_idle_timeout": "3m",
    "cpu_busy_timeout": "8m",
    "warn_before": "1m",
    "max_extensions": 1,
    "extension": "3m",
    "busy_grace": "2m",
    "min_runtime": "3m",
}
NODES = ["node-h100", "node-h100s", "node-a100"]
#: the pool config's policy, as the tests count windows with it
IDLE_TIMEOUT, PRESSURE_TIMEOUT, CPU_TIMEOUT, WARN = 300.0, 180.0, 480.0, 60.0
WINDOW, STEP = 60.0, 20.0
USERS = ("alice", "bob", "carol", "dave", "erin", "frank", "admin")
#: users whose servers the reclaimer may not reach (its token is refused: kernel "unknown")
UNREADABLE = ("carol", "dave")
#: the reclaimer's hub service and role: the scopes it documents, with ``access:servers``
#: narrowed to the users it may read
RECLAIMER = "gpupool-reclaimer"


def reclaimer_config(token: str) -> str:
    """Hub config (for ``HubEnv.extra_config``, so braces doubled) registering the reclaimer."""
    access = [f"access:servers!user={u}" for u in USERS if u not in UNREADABLE]
    scopes = [
        "list:users",
        "read:servers",
        "servers",
        "admin:server_state",
        "custom:gpupool:reclaim",
        *access,
    ]
    service = repr({"name": RECLAIMER, "api_token": token})
    role = repr({"name": RECLAIMER, "services": [RECLAIMER], "scopes": scopes})
    return (
        (
            f"\nc.JupyterHub.services.append({service})\nc.JupyterHub.load_roles.append({role})\n"
            "c.JupyterHub.allow_named_servers = True\n"
            "c.GPUPoolSpawnerMixin.allow_cpu_only = True\n"
        )
        .replace("{", "{{")
        .replace("}", "}}")
    )


# -- the rig -----------------------------------------------------------------------------------


@dataclass
class Rig:
    """The hub, the pool, the simulated GPUs, the clock, the users' kernels and the reclaimer."""

    env: HubEnv
    clock: ClockFile
    agent: SimAgent
    reclaimer_token: str
    reclaimer: Any = None
    last: Any = None
    hooked: list[tuple[str, str]] = field(default_factory=list)
    kernels: dict[str, KernelDriver] = field(default_factory=dict)
    rounds: int = 0

    # the hub and the pool ----------------------------------------------------------------

    def admin(self) -> str:
        return self.env.token("admin")

    def spawn(self, user: str, offer: str, server: str = "") -> dict:
        """Start ``user``'s server on ``offer`` through the hub and wait until it is ready."""
        path = f"{self.env.hub_api}/users/{user}/servers/{server}"
        r = request("POST", path, self.env.admin_api_token, {"gpupool_offer": offer})
        assert r.status in (201, 202), r.body
        return self.wait_ready(user, server)

    def server(self, user: str, server: str = "") -> dict:
        r = request("GET", f"{self.env.hub_api}/users/{user}", self.env.admin_api_token)
        return r.json()["servers"].get(server, {})  # type: ignore[index,union-attr]

    def wait_ready(self, user: str, server: str = "") -> dict:
        return wait_until(
            lambda: (s := self.server(user, server)).get("ready") and s,
            120,
            f"{user}/{server}'s server to be ready",
            step=0.2,
            info=self.env.logs,
        )

    def wait_stopped(self, user: str, server: str = "") -> None:
        wait_until(
            lambda: not self.server(user, server),
            120,
            f"{user}/{server}'s server to stop",
            step=0.2,
            info=self.env.logs,
        )

    def leases(self, user: str) -> list[dict]:
        url = f"{self.env.api}/allocations?user={user}&limit=1000"
        return request("GET", url, self.env.spawner_token).json()["items"]  # type: ignore[index]

    def lease(self, user: str, server: str = "") -> dict:
        """The user's live lease of ``server`` (exactly one)."""
        (lease,) = [
            le
            for le in self.leases(user)
            if le["server"] == server and le["state"] not in ("released", "queued")
        ]
        return lease

    def typed(self, user: str, ago: float) -> None:
        """The user typed ``ago`` seconds ago in a visible lab tab of each live server: the
        report the lab sends the pool (with the user's token, as the server's lab does)."""
        for le in self.leases(user):
            if le["state"] in ("active", "reclaiming"):
                url = f"{self.env.api}/allocations/{le['id']}/presence"
                r = request("POST", url, self.env.token(user), {"idle_for": ago})
                assert r.status == 200, r.body

    def get_lease(self, lease_id: str) -> dict:
        r = request("GET", f"{self.env.api}/allocations/{lease_id}", self.env.spawner_token)
        assert r.status == 200, r.body
        return r.json()  # type: ignore[return-value]

    def me(self, user: str) -> dict:
        r = request("GET", f"{self.env.api}/users/me", self.env.token(user))
        assert r.status == 200, r.body
        return r.json()  # type: ignore[return-value]

    def events(self, lease_id: str) -> list[dict]:
        url = f"{self.env.api}/events?lease={lease_id}&limit=1000"
        return request("GET", url, self.admin()).json()["items"]  # type: ignore[index]

    def policies(self, default: dict | None = None, **offers: dict) -> None:
        """``PUT reclaim/policies``: the test's policy over the config's (``offers`` by name)."""
        section: dict[str, Any] = {"default": {**POLICY, **(default or {})}}
        if offers:
            section["offers"] = {name.replace("_", "-"): body for name, body in offers.items()}
        r = request("PUT", f"{self.env.api}/reclaim/policies", self.admin(), section)
        assert r.status == 200, r.body

    # the three sources --------------------------------------------------------------------

    def gpu(self, lease: dict, state: str) -> None:
        """Make the lease's device ``busy`` or ``idle`` (whole GPUs and shares, by load), or,
        on an A100 MIG instance, ``unknown`` (a process holds memory) or ``idle`` (none)."""
        machine = self.agent.machines[lease["node"]]
        slot = lease["slots"][0]
        if slot["kind"] == "mig":
            for pid in list(self._procs.pop(slot["mig_uuid"], [])):
                machine.remove_process(pid)
            if state == "unknown":
                self._procs[slot["mig_uuid"]] = [machine.add_process(slot["mig_uuid"], 4096)]
            else:
                assert state == "idle", "an A100 MIG instance is busy only by a memory change"
            return
        assert state in ("busy", "idle")
        machine.set_load(
            slot["gpu"], {"pattern": "steady", "level": 80} if state == "busy" else "idle"
        )

    _procs: dict[str, list[int]] = field(default_factory=dict)

    def kernel(self, user: str, server: str = "") -> KernelDriver:
        """A kernel on the user's server, started on first use (the user's own token)."""
        key = f"{user}/{server}"
        if key not in self.kernels:
            self.kernels[key] = KernelDriver(self.env, user, server)
            self.kernels[key].start()
        return self.kernels[key]

    # rounds -------------------------------------------------------------------------------

    def round(self, present: tuple[str, ...] = ()) -> dict[str, dict]:
        """One window: ``WINDOW`` seconds of the clock with GPU samples every ``STEP``, the
        users in ``present`` active at its end, then one reclaimer round. Returns the pool's
        decisions by lease id."""
        self.agent.run(WINDOW, STEP)
        for user in present:  # inside this window, not at its end (where the next begins)
            self.typed(user, STEP / 2)
        self.rounds += 1
        self.last = asyncio.run(self.reclaimer.run_once())
        assert self.last.result == "ok", self.last
        return {d["lease"]: d for d in self.last.decisions}

    def make_reclaimer(self, holder: str = "e2e-reclaimer") -> Any:
        """The reclaimer's core on the test's clock, with the documented hub role's token
        (``access:servers`` narrowed: ``UNREADABLE`` users' servers refuse it); its
        ``notify_hook`` records every event."""
        from jupyterhub_gpupool.hubclient import HubClient
        from jupyterhub_gpupool.poolclient import PoolClient
        from jupyterhub_gpupool.reclaim.core import Reclaimer

        def hook(event: str, lease: dict, decision: dict) -> None:
            self.hooked.append((event, decision["lease"]))

        return Reclaimer(
            PoolClient(self.env.api, self.reclaimer_token),
            HubClient(self.env.hub_api, self.reclaimer_token, proxy_url=self.env.hub_url),
            holder=holder,
            interval=WINDOW,
            clock=self.clock,
            notify_hook=hook,
            poll_interval=0.2,
        )


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory):
    import secrets

    tmp = tmp_path_factory.mktemp("reclaim")
    clock = ClockFile(tmp / "clock", time.time() + 180)
    token = secrets.token_hex(16)
    env = HubEnv(
        tmp,
        f"sqlite:///{tmp}/pool.sqlite",
        write_pool(tmp, POOL.replace("{policy}", json.dumps(POLICY))),
        USERS,
        service_args=(
            "--PoolService.decisions=thread",
            "--PoolService.agent_timeout=0",  # the clock jumps: nodes stay reachable
            "--PoolService.reconcile_interval=0",  # made-up waiters' requests stay queued
            "--PoolService.housekeeping_interval=1",
            "--PoolService.grant_timeout=86400",
        ),
        extra_config=SPAWNER_CONFIG + reclaimer_config(token),
        python=clocked_service_python(clock),
    )
    (tmp / "home").mkdir()
    with env.running():
        wait_reconciled(env)
        agent = SimAgent(env, env.pool_config, NODES, clock)  # type: ignore[arg-type]
        agent.report_inventory()
        rig = Rig(env, clock, agent, token)
        rig.reclaimer = rig.make_reclaimer()
        try:
            yield rig
        finally:
            for user in USERS:
                for name in ("", *(f"s{i}" for i in range(4))):
                    request(
                        "DELETE",
                        f"{env.hub_api}/users/{user}/servers/{name}",
                        env.admin_api_token,
                    )
            print(env.logs())


def _epoch(stamp: str) -> float:
    """Epoch seconds of the pool's ISO 8601 timestamps."""
    from datetime import datetime

    return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


# -- one test per row of the cases table ---------------------------------------------------------

#: who holds the lease of a row: the GPU it can show and whether the reclaimer reads its kernels
HOLDERS = {
    ("whole", True): ("alice", "h100"),
    ("whole", False): ("carol", "h100"),
    ("mig", True): ("bob", "a100-3g"),
    ("mig", False): ("dave", "a100-3g"),
}
#: the rows with presence first: posting activity is only possible while the test's clock is
#: within the hour ahead of the hub's that the hub accepts
ROWS = sorted(CASES, key=lambda c: c.presence != "present")


def _row_id(case: Case) -> str:
    return f"{case.gpu}-{case.kernel}-{case.presence}"


@pytest.fixture(scope="module")
def row_leases(rig: Rig) -> dict[str, dict]:
    """The four servers the rows run on (spawned together)."""
    for (_, _), (user, offer) in HOLDERS.items():
        r = request(
            "POST",
            f"{rig.env.hub_api}/users/{user}/server",
            rig.env.admin_api_token,
            {"gpupool_offer": offer},
        )
        assert r.status in (201, 202), r.body
    out = {}
    for user, _ in HOLDERS.values():
        rig.wait_ready(user)
        out[user] = rig.lease(user)
    return out


def _observe(rig: Rig, lease: dict, gpu: str, kernel: str, presence: str) -> tuple[str, ...]:
    """Set the three sources of the row on the lease's device, kernel and user; returns who is
    present (for :meth:`Rig.round`)."""
    user = lease["user"]
    rig.gpu(lease, gpu)
    k = rig.kernel(user)  # the user's own token: the user's server lets them in
    connected = presence == "connected"
    if kernel == "busy":
        k.busy(stay_connected=connected)
    elif connected:  # a tab left open on an idle notebook
        k.connect()
    return (user,) if presence == "present" else ()


def _clear(rig: Rig, lease: dict) -> None:
    """No cell runs on the lease's server, no tab is open."""
    k = rig.kernels.get(f"{lease['user']}/{lease['server']}")
    if k is not None:
        if k.state() == "busy":
            k.interrupt()
        if k.socket is not None:
            k.disconnect()


def _settle(rig: Rig, lease: dict) -> None:
    """Make the lease active for a window: its notice, if any, is cancelled, its counts reset."""
    _clear(rig, lease)
    mig = lease["slots"][0]["kind"] == "mig"
    for _ in range(2):
        if mig:  # a MIG instance on an A100 works when its memory moves
            rig.gpu(lease, "idle")
            rig.agent.run(WINDOW / 2, STEP)
            rig.gpu(lease, "unknown")
            decisions = rig.round()
        else:
            rig.gpu(lease, "busy")
            decisions = rig.round()
        d = decisions[lease["id"]]
        if d["kind"] in ("none", "cancel") and d["evidence"]["verdict"] == "active":
            break
    assert rig.get_lease(lease["id"])["reclaim"] is None


@pytest.mark.parametrize("case", ROWS, ids=_row_id)
def test_each_row_of_the_cases_table(rig: Rig, row_leases: dict, case: Case):
    whole = case.gpu in ("busy", "idle")
    user, _ = HOLDERS[("whole" if whole else "mig", case.kernel != "unknown")]
    lease = row_leases[user]
    others = [le for le in row_leases.values() if le["id"] != lease["id"]]
    # first the policy (a round under the last one could act on the last row's notice), then
    # an active window: an exempt lease counts on, so the row starts from reset counts
    rig.policies(default={"exempt_users": [le["user"] for le in others]})
    _settle(rig, lease)
    # a few idle windows first, so an active row visibly resets a count
    prime = "idle" if whole else "unknown"
    rig.gpu(lease, prime)
    primed = rig.round()[lease["id"]]["evidence"]
    # (where the kernel cannot be read either, the A100 instance never counts: nothing to reset)
    assert primed["gpu_idle_for"] > 0 or (case.gpu, case.kernel) == ("unknown", "unknown"), primed
    present = _observe(rig, lease, case.gpu, case.kernel, case.presence)
    # A server that refuses the reclaimer's token shows it nothing, its open connections
    # included: the user's open tab reads as absent there, a row with the same verdict.
    shown = case.presence
    if (case.kernel, case.presence) == ("unknown", "connected"):
        shown = "absent"
        assert classify(case.gpu, case.kernel, shown).verdict == case.verdict
    try:
        timeout = {"active": WINDOW, "idle": IDLE_TIMEOUT, "idle-cpu": CPU_TIMEOUT}
        seen: list[dict] = []
        for _ in range(int(timeout[case.verdict] // WINDOW) + 1):
            d = rig.round(present)[lease["id"]]
            seen.append(d)
            ev = d["evidence"]
            assert (ev["gpu"], ev["kernel"], ev["presence"], ev["verdict"]) == (
                case.gpu,
                case.kernel,
                shown,
                case.verdict,
            ), d
            if d["kind"] == "notice":
                break
            assert d["kind"] == "none", (d, rig.events(lease["id"]))
            if case.verdict == "active":
                assert ev["idle_for"] == ev["gpu_idle_for"] == 0, d
            elif case.verdict == "idle-cpu":
                assert ev["idle_for"] == 0 and ev["gpu_idle_for"] > 0, d
        notices = [n for n in rig.me(user)["notices"] if n["lease"] == lease["id"]]
        if case.verdict == "active":
            assert seen[-1]["kind"] == "none" and notices == []
            return
        # the count reaches its timeout less the notice: the notice, seen by the user
        assert seen[-1]["kind"] == "notice", seen[-3:]
        kind = "idle" if case.verdict == "idle" else "cpu"
        held = rig.get_lease(lease["id"])
        assert held["state"] == "reclaiming" and held["reclaim"]["kind"] == kind, held
        assert held["reclaim"]["action"] == "stop"
        (notice,) = notices
        assert notice["deadline"] == held["reclaim"]["deadline"] == seen[-1]["deadline"]
        assert notice["action"] == "stop" and "idle" in notice["reason"]
        ev = seen[-1]["evidence"]
        due = IDLE_TIMEOUT if kind == "idle" else CPU_TIMEOUT
        assert due - WARN <= (ev["idle_for"] if kind == "idle" else ev["gpu_idle_for"]) < due
    finally:
        _clear(rig, lease)


# -- what the reclaimer does with the decisions ----------------------------------------------


def _only(rig: Rig, *subjects: dict, default: dict | None = None, **offers: dict) -> None:
    """Reclaim applies to the ``subjects`` leases' users only (everyone else exempt: first, so
    no round acts on an earlier test's notice), each then starting from an active window (an
    exempt lease counts on, so its counts are reset)."""
    users = {le["user"] for le in subjects}
    exempt = sorted(set(USERS) - users)
    rig.policies(default={**(default or {}), "exempt_users": exempt}, **offers)
    for lease in subjects:
        _clear(rig, lease)
        _settle(rig, lease)


def _idle(rig: Rig, lease: dict) -> None:
    """The lease's GPU idle, its kernel idle, its user away."""
    _clear(rig, lease)
    rig.gpu(lease, "idle")


def _until(rig: Rig, lease: dict, kind: str, windows: int) -> tuple[dict, list[dict]]:
    """Run windows until the lease's decision is ``kind``; that decision and the ones before."""
    seen = []
    for _ in range(windows):
        d = rig.round()[lease["id"]]
        seen.append(d)
        if d["kind"] == kind:
            return d, seen
    raise AssertionError(f"no {kind} for {lease['user']} in {windows} windows: {seen[-3:]}")


def _write_notebook(rig: Rig, user: str, path: str, server: str = "") -> dict:
    """A notebook on the user's server (contents API) open in a session, as a lab tab has it."""
    k = rig.kernel(user)
    nb = {
        "type": "notebook",
        "content": {
            "cells": [{"cell_type": "markdown", "metadata": {}, "source": f"work of {user}"}],
            "metadata": {},
            "nbformat": 4,
            "nbformat_minor": 5,
        },
    }
    r = k.api("PUT", f"contents/{path}", nb)
    assert r.status in (200, 201), r.body
    session = {"path": path, "type": "notebook", "name": path, "kernel": {"name": "python3"}}
    r = k.api("POST", "sessions", session)
    assert r.status == 201, r.body
    return nb


def _on_disk(rig: Rig, user: str, path: str) -> str:
    """The text of the notebook's first cell, as the file on disk has it."""
    nb = json.loads((rig.env.dir / "home" / user / path).read_text())
    source = nb["cells"][0]["source"]
    return "".join(source) if isinstance(source, list) else source


def _respawn(rig: Rig, user: str, offer: str, server: str = "") -> dict:
    """The user's server (re)started on ``offer``; their lease of it."""
    if rig.server(user, server):
        request(
            "DELETE", f"{rig.env.hub_api}/users/{user}/servers/{server}", rig.env.admin_api_token
        )
        rig.wait_stopped(user, server)
    rig.kernels.pop(f"{user}/{server}", None)
    rig.spawn(user, offer, server)
    return rig.lease(user, server)


def _environ(rig: Rig, user: str, server: str = "") -> dict[str, str]:
    """The real environment of the user's server process (the local spawner's pid)."""
    pid = rig.server(user, server)["state"]["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes().decode()
    return dict(item.split("=", 1) for item in raw.split("\0") if "=" in item)


def _held(rig: Rig, user: str, offer: str, server: str = "") -> dict:
    """The user's lease of ``offer`` on ``server``, as an earlier test left it, else a new one
    (so each test also runs on its own)."""
    live = [le for le in rig.leases(user) if le["server"] == server and le["state"] != "released"]
    if [le["offer"] for le in live] == [offer] and rig.server(user, server).get("ready"):
        return live[0]
    return _respawn(rig, user, offer, server)


def _keepalive(rig: Rig, lease: dict, user: str | None = None) -> Any:
    token = rig.env.token(user or lease["user"])
    return request("POST", f"{rig.env.api}/allocations/{lease['id']}/keepalive", token, {})


@pytest.fixture(scope="module")
def after_rows(rig: Rig, row_leases: dict) -> dict[str, dict]:
    """Once the rows ran: bob's and dave's A100 servers stopped, erin and frank without a
    guarantee (what they hold from now on is borrowed). carol's H100 stays, exempt."""
    for user in ("bob", "dave"):
        request("DELETE", f"{rig.env.hub_api}/users/{user}/server", rig.env.admin_api_token)
        rig.wait_stopped(user)
    for user in ("erin", "frank"):
        body = {"guarantee": 0, "limit": 3}
        r = request("PATCH", f"{rig.env.api}/quotas/users/{user}", rig.admin(), body)
        assert r.status == 200, r.body
    return row_leases


def test_a_kernel_busy_on_the_gpu_is_never_reclaimed(rig: Rig, after_rows: dict):
    lease = after_rows["alice"]
    _only(rig, lease)
    rig.gpu(lease, "busy")
    rig.kernel("alice").busy()  # the tab closed; the cell trains on
    for _ in range(int((CPU_TIMEOUT + IDLE_TIMEOUT) // WINDOW)):
        d = rig.round()[lease["id"]]
        assert d["kind"] == "none" and d["evidence"]["verdict"] == "active", d
    # even at its maximum age: the notice comes, the action waits while the GPU works
    exempt = sorted(set(USERS) - {"alice"})
    rig.policies(default={"max_age": "4m", "exempt_users": exempt})  # the cell runs on
    d, _ = _until(rig, lease, "notice", 6)
    assert rig.get_lease(lease["id"])["reclaim"]["kind"] == "max_age"
    d, _ = _until(rig, lease, "deferred", 3)
    for _ in range(3):
        assert rig.round()[lease["id"]]["kind"] == "deferred"
    assert rig.server("alice").get("ready") and rig.get_lease(lease["id"])["state"] == "reclaiming"
    kinds = [e["kind"] for e in rig.events(lease["id"])]
    assert "reclaim-acting" not in kinds and "reclaimed" not in kinds
    rig.policies(default={"exempt_users": ["alice"]})  # the max-age notice ends
    assert rig.round()[lease["id"]]["kind"] == "cancel"
    assert rig.get_lease(lease["id"])["state"] == "active"


def test_keep_my_gpu_extends_within_the_limit(rig: Rig, after_rows: dict):
    lease = after_rows["alice"]
    _only(rig, lease)
    _idle(rig, lease)
    _until(rig, lease, "notice", 6)
    assert [n["lease"] for n in rig.me("alice")["notices"]] == [lease["id"]]
    assert _keepalive(rig, lease, "bob").status == 404  # someone else's lease: as missing
    r = _keepalive(rig, lease)
    assert r.status == 200 and r.json()["state"] == "active" and r.json()["reclaim"] is None
    assert rig.me("alice")["notices"] == []
    extended = [e for e in rig.events(lease["id"]) if e["kind"] == "reclaim-extended"]
    assert extended and extended[-1]["data"]["extensions"] == 1
    until = _epoch(extended[-1]["data"]["until"])
    # idle on: the next notice comes, but not before the extension ends
    d, before = _until(rig, lease, "notice", 10)
    assert _epoch(d["deadline"]) >= until
    assert all(x["kind"] == "none" for x in before[:-1])
    r = _keepalive(rig, lease)
    assert r.status == 409, r.body
    error = r.json()["error"]
    assert error["code"] == "extension_limit" and error["allowed"] == [1], error
    assert rig.get_lease(lease["id"])["state"] == "reclaiming"


def test_stop_saves_then_stops_and_releases(rig: Rig, after_rows: dict):
    lease = after_rows["alice"]
    _write_notebook(rig, "alice", "work.ipynb")
    _only(rig, lease)
    _idle(rig, lease)
    _until(rig, lease, "notice", 6)
    d, _ = _until(rig, lease, "act", 3)
    assert d["action"] == "stop" and d["release_reason"] == "reclaimed-idle"
    outcome = rig.last.outcomes[lease["id"]]
    assert outcome.result == "done" and outcome.saved == ["work.ipynb"], outcome
    assert not rig.server("alice")
    assert _on_disk(rig, "alice", "work.ipynb") == "work of alice"
    checkpoints = rig.env.dir / "home" / "alice" / ".ipynb_checkpoints"
    assert (checkpoints / "work-checkpoint.ipynb").exists()
    released = rig.get_lease(lease["id"])
    assert (released["state"], released["release_reason"]) == ("released", "reclaimed-idle")
    (done,) = [x for x in rig.me("alice")["reclaims"] if x["lease"] == lease["id"]]
    assert done["action"] == "stop" and done["outcome"] == "done"
    assert done["saved"] == ["work.ipynb"] and done["release_reason"] == "reclaimed-idle"
    assert [e for e, le in rig.hooked if le == lease["id"]][-3:] == ["notice", "act", "done"]


def test_shrink_restarts_the_server_on_the_smaller_offer(rig: Rig, after_rows: dict):
    lease = _respawn(rig, "alice", "h100")
    _write_notebook(rig, "alice", "shrunk.ipynb")
    _only(rig, lease, h100={"action": "shrink:h100-half"})
    _idle(rig, lease)
    notice, _ = _until(rig, lease, "notice", 6)
    assert notice["action"] == "shrink:h100-half"
    d, _ = _until(rig, lease, "act", 3)
    assert d["target_offer"] == "h100-half" and d["target_lease"]
    assert rig.last.outcomes[lease["id"]].result == "done", rig.last.outcomes
    server = rig.wait_ready("alice")
    assert server["user_options"]["gpupool_offer"] == "h100-half"
    new = rig.lease("alice")
    assert (new["id"], new["offer"], new["state"]) == (d["target_lease"], "h100-half", "active")
    assert new["slots"][0]["kind"] == "shared"
    environ = _environ(rig, "alice")  # the restarted server runs on the share, told its part
    assert environ["CUDA_VISIBLE_DEVICES"] == new["slots"][0]["gpu"]
    assert environ["GPUPOOL_GPU_FRACTION"] == "0.5" and environ["GPUPOOL_LEASE_ID"] == new["id"]
    old = rig.get_lease(lease["id"])
    assert (old["state"], old["release_reason"]) == ("released", "reclaimed-idle")
    assert _on_disk(rig, "alice", "shrunk.ipynb") == "work of alice"
    rig.kernels.pop("alice/", None)  # a new server: its kernels are new
    r = rig.kernel("alice").api("GET", "contents/shrunk.ipynb")
    assert r.status == 200 and r.json()["content"]["cells"][0]["source"] == "work of alice"


def test_release_gpu_restarts_the_server_without_a_gpu(rig: Rig, after_rows: dict):
    lease = _held(rig, "alice", "h100-half")  # where the shrink test left it
    _write_notebook(rig, "alice", "cpu.ipynb")
    _only(rig, lease, h100_half={"action": "release-gpu"})
    _idle(rig, lease)
    _until(rig, lease, "notice", 6)
    d, _ = _until(rig, lease, "act", 3)
    assert d["action"] == "release-gpu"
    assert rig.last.outcomes[lease["id"]].result == "done", rig.last.outcomes
    server = rig.wait_ready("alice")
    assert server["user_options"]["gpupool_offer"] == ""
    assert [le for le in rig.leases("alice") if le["state"] != "released"] == []
    old = rig.get_lease(lease["id"])
    assert (old["state"], old["release_reason"]) == ("released", "reclaimed-idle")
    rig.kernels.pop("alice/", None)
    r = rig.kernel("alice").api("GET", "contents/cpu.ipynb")
    assert r.status == 200 and r.json()["content"]["cells"][0]["source"] == "work of alice"
    environ = _environ(rig, "alice")
    assert environ["CUDA_VISIBLE_DEVICES"] == "-1" and "GPUPOOL_LEASE_ID" not in environ


def _allocate(rig: Rig, user: str, server: str, offer: str = "h100") -> dict:
    body = {"user": user, "server": server, "offer": offer}
    r = request("POST", f"{rig.env.api}/allocations", rig.env.spawner_token, body)
    assert r.status == 201, r.body
    return r.json()  # type: ignore[return-value]


def _fill(rig: Rig) -> list[dict]:
    """Grants (no server: not watched) for every H100 still free, so the next request waits."""
    offers = request("GET", f"{rig.env.api}/offers", rig.env.token("admin")).json()
    free = next(o for o in offers["items"] if o["name"] == "h100")["available"]  # type: ignore[index]
    body = {"guarantee": 0, "limit": 8}
    assert request("PATCH", f"{rig.env.api}/quotas/users/admin", rig.admin(), body).status == 200
    return [_allocate(rig, "admin", f"x{i}") for i in range(free)]


def _withdraw(rig: Rig, lease: dict) -> None:
    r = request("DELETE", f"{rig.env.api}/allocations/{lease['id']}", rig.env.spawner_token)
    assert r.status == 200, r.body


def test_a_waiter_for_the_same_hardware_shortens_the_timeout(rig: Rig, after_rows: dict):
    lease = _respawn(rig, "erin", "h100")
    fillers = _fill(rig)
    try:
        waiter = _allocate(rig, "frank", "q")
        assert waiter["state"] == "queued", waiter
        _only(rig, lease)
        _idle(rig, lease)
        d, _ = _until(rig, lease, "notice", 6)
        ev = d["evidence"]
        assert ev["pressure"] is True and "others wait" in d["reason"]
        assert PRESSURE_TIMEOUT - WARN <= ev["idle_for"] < IDLE_TIMEOUT - WARN, ev
        assert rig.get_lease(lease["id"])["reclaim"]["pressure"] is True
        # nobody waits any more: the short notice is withdrawn
        _withdraw(rig, waiter)
        d = rig.round()[lease["id"]]
        assert d["kind"] == "cancel" and "nobody waits" in d["reason"], d
    finally:
        for f in fillers:
            _withdraw(rig, f)


def test_borrowed_capacity_goes_back_most_over_guarantee_first(rig: Rig, after_rows: dict):
    erin = _held(rig, "erin", "h100")  # 1 borrowed H100 (guarantee 0)
    frank = [_respawn(rig, "frank", "h100", s) for s in ("s0", "s1")]  # 2 borrowed
    subjects = [erin, *frank]
    # long idle timeouts: only the borrowed reclaim gives notice here
    slow = {"idle_timeout": "30m", "pressure_idle_timeout": "20m", "cpu_busy_timeout": "60m"}
    _only(rig, *subjects, default={**slow, "min_runtime": "2m"})
    for le in subjects:
        _idle(rig, le)
    rig.round()
    rig.round()
    rig.gpu(frank[1], "busy")  # s1 (the youngest) worked last: s0 is the idlest of frank's
    rig.round()
    rig.gpu(frank[1], "idle")
    fillers = _fill(rig)
    bob = request("POST", f"{rig.env.api}/allocations", rig.env.token("bob"), {"offer": "h100"})
    assert bob.json()["state"] == "queued", bob.body  # bob is within his guarantee
    d, _ = _until(rig, frank[0], "notice", 3)
    decisions = rig.last.decisions
    notices = [x for x in decisions if x["kind"] == "notice"]
    assert [x["lease"] for x in notices] == [frank[0]["id"]], notices  # one: what bob needs
    held = rig.get_lease(frank[0]["id"])["reclaim"]
    assert held["kind"] == "borrowed" and "bob" in held["reason"]
    r = _keepalive(rig, frank[0])
    assert r.status == 409 and r.json()["error"]["code"] == "not_extendable"
    d, _ = _until(rig, frank[0], "act", 3)
    assert d["release_reason"] == "reclaimed-borrowed"
    assert not rig.server("frank", "s0")
    gone = rig.get_lease(frank[0]["id"])
    assert (gone["state"], gone["release_reason"]) == ("released", "reclaimed-borrowed")
    bobs = bob.json()["id"]
    wait_until(lambda: rig.get_lease(bobs)["state"] == "granted", what="bob's grant")
    assert rig.get_lease(erin["id"])["state"] == rig.get_lease(frank[1]["id"])["state"] == "active"
    for lease in [{"id": bobs}, *fillers]:
        _withdraw(rig, lease)


def test_restart_mid_grace_keeps_the_deadline(rig: Rig, after_rows: dict):
    lease = _held(rig, "erin", "h100")
    long_notice = {
        "idle_timeout": "10m",
        "pressure_idle_timeout": "6m",
        "cpu_busy_timeout": "20m",
        "warn_before": "5m",
    }
    _only(rig, lease, default=long_notice)
    _idle(rig, lease)
    _until(rig, lease, "notice", 8)
    deadline = rig.get_lease(lease["id"])["reclaim"]["deadline"]
    # the reclaimer dies without giving up its lead; the pool service is killed and restarted
    before = _events_total(rig)
    rig.env.kill_service()
    rig.env.start_service()
    wait_until(lambda: _reconciled_since(rig, before), what="the restarted service's reconcile")
    assert rig.get_lease(lease["id"])["reclaim"]["deadline"] == deadline
    rig.reclaimer = rig.make_reclaimer("e2e-reclaimer-2")  # a new replica: a new name
    acted = None
    for _ in range(8):
        rig.agent.run(WINDOW, STEP)
        result = asyncio.run(rig.reclaimer.run_once())
        if result.result == "not_leader":  # the dead one's lock runs out first
            continue
        assert result.result == "ok", result
        d = {x["lease"]: x for x in result.decisions}[lease["id"]]
        if d["kind"] == "act":
            acted = rig.clock()
            break
        assert d["kind"] == "noticed", d
        assert rig.get_lease(lease["id"])["reclaim"]["deadline"] == deadline
    assert acted is not None and acted >= _epoch(deadline) - 1e-3  # (microseconds in ISO)
    assert acted - _epoch(deadline) < WINDOW  # at the deadline, not later
    released = rig.get_lease(lease["id"])
    assert released["release_reason"] == "reclaimed-idle"


def _events_total(rig: Rig) -> int:
    return request("GET", f"{rig.env.api}/events?limit=1", rig.admin()).json()["total"]  # type: ignore[index]


def _reconciled_since(rig: Rig, offset: int) -> bool:
    url = f"{rig.env.api}/events?offset={offset}&limit=1000"
    items = request("GET", url, rig.admin()).json()["items"]  # type: ignore[index]
    return any(e["kind"] == "reconciled" for e in items)


def test_stale_telemetry_never_acts(rig: Rig, after_rows: dict):
    lease = _held(rig, "frank", "h100", "s1")
    _only(rig, lease)
    _idle(rig, lease)
    _until(rig, lease, "notice", 6)
    deadline = _epoch(rig.get_lease(lease["id"])["reclaim"]["deadline"])
    rig.agent.silent.add("node-h100")  # its agent stops reporting
    try:
        for _ in range(4):  # well past the deadline: every round stale, nothing done
            d = rig.round()[lease["id"]]
            assert d["kind"] == "stale" and "telemetry" in d["reason"], d
        assert rig.clock() > deadline + WINDOW
        assert rig.server("frank", "s1").get("ready")
        assert rig.get_lease(lease["id"])["state"] == "reclaiming"
    finally:
        rig.agent.silent.clear()
    # fresh data again: the notice stands, and fresh idle data carries it out
    d, _ = _until(rig, lease, "act", 2)
    assert rig.get_lease(lease["id"])["release_reason"] == "reclaimed-idle"


def test_keepalive_racing_the_action_one_wins(rig: Rig, after_rows: dict):
    """The user's keep-my-GPU and the round that acts: whichever the pool's writer takes first
    wins, and the audit shows which. Three ways: keepalive first, the claim first (a keepalive
    from inside the reclaimer's act hook, after the claim), and both at once."""
    import threading

    lease = _respawn(rig, "frank", "h100", "s1")
    _only(rig, lease, default={"max_extensions": 3})
    _idle(rig, lease)
    _until(rig, lease, "notice", 6)
    rig.agent.run(WARN, STEP)  # at the deadline: the next round acts
    assert _keepalive(rig, lease).status == 200  # the user first: extended, nothing acts
    d = rig.round()[lease["id"]]
    assert d["kind"] == "none", d
    kinds = [e["kind"] for e in rig.events(lease["id"])]
    assert "reclaim-extended" in kinds and "reclaim-acting" not in kinds

    # at once: a keepalive and the round start together
    _until(rig, lease, "notice", 8)
    rig.agent.run(WARN, STEP)
    answers: list[Any] = []
    go = threading.Barrier(2)

    def keep() -> None:
        go.wait()
        answers.append(_keepalive(rig, lease))

    t = threading.Thread(target=keep)
    t.start()
    go.wait()
    decision = rig.round()[lease["id"]]
    t.join()
    (answer,) = answers
    events = rig.events(lease["id"])
    extended = sum(e["kind"] == "reclaim-extended" for e in events)
    acting = sum(e["kind"] == "reclaim-acting" for e in events)
    if answer.status == 200:  # the keepalive won: extended, not acted on
        assert decision["kind"] != "act" and extended == 2 and acting == 0, (decision, events)
        assert rig.server("frank", "s1").get("ready")
        # the claim first: the keepalive comes once the round claimed the action
        _until(rig, lease, "notice", 8)
        rig.agent.run(WARN, STEP)
        late: list[Any] = []
        hook = rig.reclaimer.notify_hook

        def keep_on_act(event: str, le: dict, dec: dict) -> None:
            hook(event, le, dec)
            if event == "act":
                late.append(_keepalive(rig, lease))

        rig.reclaimer.notify_hook = keep_on_act
        try:
            decision = rig.round()[lease["id"]]
        finally:
            rig.reclaimer.notify_hook = hook
        (answer,) = late
        events = rig.events(lease["id"])
        extended = sum(e["kind"] == "reclaim-extended" for e in events)
        acting = sum(e["kind"] == "reclaim-acting" for e in events)
    assert answer.status == 409 and answer.json()["error"]["code"] == "reclaim_in_progress"
    assert decision["kind"] == "act" and acting == 1, (decision, events)
    assert [e["kind"] for e in events].index("reclaim-acting") > max(
        i for i, e in enumerate(events) if e["kind"] == "reclaim-extended"
    )
    released = rig.get_lease(lease["id"])
    assert (released["state"], released["release_reason"]) == ("released", "reclaimed-idle")

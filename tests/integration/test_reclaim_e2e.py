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
    post_activity,
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
        "read:users:activity",
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

    def kernel(self, user: str) -> KernelDriver:
        if user not in self.kernels:
            self.kernels[user] = KernelDriver(self.env, user)
            self.kernels[user].start()
        return self.kernels[user]

    # rounds -------------------------------------------------------------------------------

    def round(self, present: tuple[str, ...] = ()) -> dict[str, dict]:
        """One window: ``WINDOW`` seconds of the clock with GPU samples every ``STEP``, the
        users in ``present`` active at its end, then one reclaimer round. Returns the pool's
        decisions by lease id."""
        self.agent.run(WINDOW, STEP)
        for user in present:  # inside this window, not at its end (where the next begins)
            post_activity(self.env, user, self.clock() - STEP / 2)
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
    k = rig.kernels.get(lease["user"])
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
    _settle(rig, lease)  # an exempt lease counts on: start from an active window
    rig.policies(default={"exempt_users": [le["user"] for le in others]})
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

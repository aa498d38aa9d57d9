"""The one home of what several test modules share: fakes, clocks, rigs and waiting.

Test modules import helpers from here (or get them as conftest fixtures), never from one
another: ``tests/unit/test_test_layout.py`` fails when a module imports a ``test_*`` module.

* **Waiting without racing the clock.** :func:`wait_until` (and :func:`wait_until_async`, and
  :func:`until` for loops that take a stop predicate) poll a condition with a *generous* bound
  and fail with a clear message; a test never sleeps a short while and hopes. Where a test must
  show that something does *not* happen, it waits for a positive marker that the system went
  past that point (an event, a counter, a round of a loop), then asserts the absence.
* **Clocks the test moves.** :class:`StoreClock` is the store's ``clock=`` (datetimes);
  :class:`SecondsClock` is a float clock (the agent loop's ``clock=``/``sleep=``, the simulated
  NVML's ``clock=``) whose ``sleep`` moves time instead of waiting.
* **The store.** :data:`STORE_POOL`, :func:`make_store`, :func:`make_instances` (play a
  dynamic-MIG node's agent by hand), :func:`lease_events`.
* **The node agent.** :class:`FakeReader`, :class:`FakeService`, :func:`make_agent`,
  :func:`run_for`: the agent loop with no real time and no socket.
* **The simulated rig.** :class:`Rig`: a store and the service's in-process telemetry of one
  simulated node, on the test's event loop, with the simulated machine at hand.
* **Pool YAML.** :func:`write_pool`: a pool config file a test may edit (the demo pool's by
  default).
* **The hub environment.** :class:`HubEnv` (a real JupyterHub + proxy + the pool service as
  processes) and :func:`request`, defined in ``tests/integration/hubenv.py`` — the harness the
  benchmarks and the docs name — and reached by tests through this module only;
  :func:`wait_reconciled` waits for the service's reconcile at start.
* **The lab package's hub.** :func:`lab_hub` (JupyterLab servers with ``jupyterlab-gpupool``
  on :data:`LAB_POOL`), :func:`start_server`, :func:`stop_server`, :func:`user_server`,
  :func:`server_environ`; :class:`LabTab` plays an open tab.

Store and service modules are imported inside the helpers that need them, so a unit test of
the agent does not import the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import random
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tests import fakekube_pods
from tests.integration.hubenv import (
    ROOT,
    SPAWNER_CONFIG,
    HubEnv,
    Response,
    chp_command,
    free_port,
    request,
    wait_http,
)

if TYPE_CHECKING:
    from jupyterhub_gpupool.store import Store
    from jupyterhub_gpupool.telemetry.agent import AgentLoop

__all__ = [
    "AGENT_API",
    "AGENT_T0",
    "BILL_POOL",
    "FAKE_MIG_CONFIGS",
    "LAB_POOL",
    "ROOT",
    "SPAWNER_CONFIG",
    "STORE_POOL",
    "STORE_T0",
    "Call",
    "FakeKubeAPI",
    "FakeReader",
    "FakeService",
    "HubEnv",
    "InProcessService",
    "LabTab",
    "Response",
    "Rig",
    "SecondsClock",
    "StoreClock",
    "TokenHubAuth",
    "WaitTimeout",
    "chp_command",
    "free_port",
    "kube_node",
    "kubeconfig",
    "lab_hub",
    "lease_events",
    "make_agent",
    "make_instances",
    "make_store",
    "reconciles",
    "request",
    "run_for",
    "self_signed_cert",
    "server_environ",
    "start_server",
    "stop_server",
    "until",
    "user_server",
    "wait_http",
    "wait_past_deadline",
    "wait_reconciled",
    "wait_until",
    "wait_until_async",
    "write_pool",
]

T = TypeVar("T")

# -- waiting ---------------------------------------------------------------------------------

#: How long a test waits for something that normally takes a fraction of a second: only a
#: hung or broken system gets there, never a slow (loaded, shared) machine.
PATIENCE = 60.0


class WaitTimeout(AssertionError):
    """What a test waited for did not happen within its (generous) bound."""


def _timed_out(what: str, timeout: float, last: object, info: Callable[[], str] | None) -> str:
    text = f"waited {timeout:g} s for {what}; the last check gave {last!r}"
    return text + (f"\n{info()}" if info is not None else "")


def wait_until(
    cond: Callable[[], T],
    timeout: float = PATIENCE,
    what: str = "the condition",
    *,
    step: float = 0.05,
    info: Callable[[], str] | None = None,
) -> T:
    """Poll ``cond()`` every ``step`` seconds until it returns something truthy; return that.

    After ``timeout`` seconds fail the test (:class:`WaitTimeout`) naming ``what``, with
    ``info()`` (logs, say) appended. The bound is for hung systems, not a speed requirement.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(_timed_out(what, timeout, result, info))
        time.sleep(step)


async def wait_until_async(
    cond: Callable[[], T],
    timeout: float = PATIENCE,
    what: str = "the condition",
    *,
    step: float = 0.05,
    info: Callable[[], str] | None = None,
) -> T:
    """:func:`wait_until` on an event loop: the loop runs (``asyncio.sleep``) between checks."""
    deadline = time.monotonic() + timeout
    while True:
        result = cond()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(_timed_out(what, timeout, result, info))
        await asyncio.sleep(step)


def until(
    cond: Callable[[], object], timeout: float = PATIENCE, what: str = "the condition"
) -> Callable[[], bool]:
    """A stop predicate for loops that poll one (``AgentLoop.run(until=...)``): true once
    ``cond()`` is; fails the test when ``timeout`` seconds pass without it."""
    deadline = time.monotonic() + timeout

    def check() -> bool:
        if cond():
            return True
        if time.monotonic() > deadline:
            raise WaitTimeout(_timed_out(what, timeout, False, None))
        return False

    return check


# -- clocks ----------------------------------------------------------------------------------

#: When a store test's day begins (its assertions name times from here).
STORE_T0 = datetime(2026, 3, 2, 9, 0, 0)


class StoreClock:
    """The store's ``clock=``: a naive UTC datetime that moves only when the test says."""

    def __init__(self, now: datetime = STORE_T0) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, **kw: float) -> None:
        """Move on by ``timedelta(**kw)``."""
        self.now += timedelta(**kw)


#: The agent tests' wall time (seconds since the epoch).
AGENT_T0 = 1_700_000_000.0


class SecondsClock:
    """A float clock (``time.time``-like) that moves only when the test, or a fake sleep, moves
    it: pass ``clock=clock, sleep=clock.sleep`` and a loop's backoffs take no real time."""

    def __init__(self, now: float = AGENT_T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move on by ``seconds``."""
        self.now += seconds

    async def sleep(self, seconds: float) -> None:
        """Sleep ``seconds`` of this clock's time: no real time passes."""
        assert seconds >= 0
        self.now += seconds


# -- the store -------------------------------------------------------------------------------

#: The store tests' pool: a dynamic-MIG A100 and an H100 node.
STORE_POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "a100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}],
        },
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 1}],
        },
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
        {"name": "a100-7g", "kind": "mig", "profile": "7g.80gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 1, "limit": 4}},
}


#: The approval tests' pool: four H100s; an offer that needs approval; quotas with an exception
#: ceiling (2 units above a limit of 1) and users with room for the big offer.
APPROVAL_POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 4}],
        },
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
        {"name": "h100x4", "kind": "gpu", "count": 4, "models": ["H100-80GB"]},
        {
            "name": "big",
            "display_name": "Four H100s",
            "kind": "gpu",
            "count": 4,
            "models": ["H100-80GB"],
            "approval": "required",
        },
        {"name": "cpu", "kind": "cpu"},
    ],
    "quotas": {
        "default": {"guarantee": 1, "limit": 1, "exception": 2},
        "users": {"carol": {"limit": 1}, "admin": {"limit": 8}, "dana": {"limit": 8}},
    },
}


#: The billing tests' pool: an A100 with dynamic MIG (slices of 1/7 and 1/2), four H100s (one-
#: and two-GPU offers), room for everyone (no queue), and prices with a lower busy price.
BILL_POOL: dict[str, Any] = {
    "nodes": [
        {"name": "a100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}]},
        {"name": "h100", "cpu_milli": 64000, "memory_mib": 262144,
         "gpus": [{"model": "H100-80GB", "count": 4}]},
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
    ],
    "quotas": {"default": {"guarantee": 8, "limit": 8}},
    "prices": {"currency": "EUR", "models": {"H100-80GB": {"held": 2, "busy": 1.5},
                                             "A100-80GB": {"held": 3, "busy": 2}}},
}  # fmt: skip


def make_store(
    url: str, clock: Callable[[], datetime], pool: dict[str, Any] = STORE_POOL, **kw: Any
) -> Store:
    """A store on ``url`` (already upgraded) with ``pool`` loaded, reading time from ``clock``."""
    from jupyterhub_gpupool.dbutil import make_engine
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import parse_pool_config
    from jupyterhub_gpupool.store import Store

    catalog = default_catalog()
    store = Store(make_engine(url), catalog, clock=clock, **kw)
    store.load_config(parse_pool_config(pool, catalog))
    return store


def make_instances(store: Store, node: str = "a100") -> None:
    """Play the dynamic-MIG node's agent: report the GPU, then make every planned instance
    (a grant is ``ready``, and may be bound, once its instance exists)."""
    from jupyterhub_gpupool.poolconfig import gpu_uuid
    from jupyterhub_gpupool.service.ingest import node_from_inventory

    made = [
        {"profile": i["profile"], "start": i["start"], "uuid": i["uuid"]}
        for c in store.pool(detail=True)["clusters"]
        for n in c["nodes"]
        if n["name"] == node
        for i in n["gpus"][0]["instances"]
        if i["uuid"]
    ]
    gpu = {
        "uuid": gpu_uuid(node, 0),
        "index": 0,
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "mig": {"enabled": True, "dynamic": True, "instances": made},
    }
    store.put_inventory(node_from_inventory(node, {"gpus": [gpu]}, store.catalog))
    results = [
        {**a, "ok": True, "error": None, "mig_uuid": f"MIG-{a['start']}-{a['profile']}"}
        for a in store.mig_plan(node)
        if a["op"] == "create"
    ]
    store.mig_results(node, results)


def lease_events(store: Store, lease: str) -> list[str]:
    """The kinds of the audit events of one lease, oldest first."""
    items, _ = store.events(lease=lease)
    return [e["kind"] for e in items]


# -- the node agent --------------------------------------------------------------------------

AGENT_API = "http://pool.test/services/gpupool/api/v1/"


class FakeReader:
    """A deterministic node: ``gpus`` GPUs with ``slices`` MIG instances each (our interface)."""

    def __init__(self, gpus: int = 2, slices: int = 0) -> None:
        self.gpus = gpus
        self.slices = slices
        self.reads = 0
        self.fail: Exception | None = None

    def inventory(self) -> dict[str, Any]:
        gpus = []
        for i in range(self.gpus):
            mig = {
                "enabled": bool(self.slices),
                "instances": [{"profile": "1g.10gb", "start": s} for s in range(self.slices)],
            }
            gpus.append(
                {"uuid": f"GPU-{i}", "index": i, "model": "NVIDIA A100-SXM4-80GB", "mig": mig}
            )
        return {"cpu_milli": 8000, "memory_mib": 65536, "gpus": gpus}

    def samples(self, now: float | None = None) -> list[dict[str, Any]]:
        if self.fail is not None:
            raise self.fail
        self.reads += 1
        out = []
        for i in range(self.gpus):
            for start in range(self.slices) if self.slices else [None]:
                out.append(
                    {
                        "gpu": f"GPU-{i}",
                        "start": start,
                        "ts": now,
                        "util": None if start is not None else float(self.reads % 100),
                        "memory_used_mib": self.reads,
                    }
                )
        return out


@dataclass
class Call:
    """One request the agent made to a :class:`FakeService`."""

    t: float
    method: str
    url: str
    body: Any
    status: int | None


@dataclass
class FakeService:
    """An in-memory transport recording every request; ``status`` None means unreachable."""

    clock: SecondsClock
    status: int | None = 200
    post_status: int | None = None  # overrides ``status`` for samples when set
    calls: list[Call] = field(default_factory=list)

    async def __call__(self, method: str, url: str, headers: dict[str, str], body: bytes):
        assert headers["Authorization"] == "token secret"
        status = self.status
        if method == "POST" and self.post_status is not None:
            status = self.post_status
        self.calls.append(Call(self.clock.now, method, url, json.loads(body), status))
        if status is None:
            raise ConnectionRefusedError("Connection refused")
        if status >= 400:
            return status, json.dumps({"status": status, "message": "nope"}).encode()
        return status, b"{}"

    def puts(self) -> list[Call]:
        return [c for c in self.calls if c.method == "PUT"]

    def posts(self, ok_only: bool = True) -> list[Call]:
        return [
            c
            for c in self.calls
            if c.method == "POST" and (not ok_only or (c.status is not None and c.status < 300))
        ]

    def delivered(self) -> list[dict[str, Any]]:
        return [s for c in self.posts() for s in c.body["samples"]]


def make_agent(
    reader: FakeReader | None = None, **kw: Any
) -> tuple[AgentLoop, SecondsClock, FakeService]:
    """An agent loop of node ``node-1`` on a fake reader, clock and service (token
    ``secret``); keyword arguments go to ``AgentLoop``."""
    from jupyterhub_gpupool.telemetry.agent import AgentLoop

    clock = SecondsClock()
    service = FakeService(clock)
    kw.setdefault("rand", random.Random(7).random)
    loop = AgentLoop(
        reader or FakeReader(),
        service,
        AGENT_API,
        "node-1",
        "secret",
        clock=clock,
        sleep=clock.sleep,
        **kw,
    )
    return loop, clock, service


def run_for(
    loop: AgentLoop, clock: SecondsClock, seconds: float, check: Callable[[], None] | None = None
) -> None:
    """Run the loop for ``seconds`` of the fake clock (no real time), calling ``check`` before
    every step."""
    end = clock.now + seconds

    def stop() -> bool:
        if check is not None:
            check()
        return clock.now >= end

    asyncio.run(loop.run(until=stop))


# -- the simulated rig -----------------------------------------------------------------------


class Rig:
    """A store and the service's in-process telemetry of one simulated node of a pool YAML, on
    the test's event loop, writing through the service's writer.

    ``sim`` is the simulated machine (processes, instances made behind the pool's back). The
    rig counts the MIG steps its telemetry loop finished (``mig_steps``: one per round, one per
    wake-up), so a test waits for the loop to have gone *past* a point (:meth:`rounds`), never
    for a while.
    """

    def __init__(self, tmp_path: Path, pool_file: Path, node: str, interval: float) -> None:
        from jupyterhub_gpupool.dbutil import make_engine, upgrade
        from jupyterhub_gpupool.pool.catalog import default_catalog
        from jupyterhub_gpupool.poolconfig import load_pool_config
        from jupyterhub_gpupool.service.telemetry_loop import LocalTelemetry
        from jupyterhub_gpupool.service.utilization import UtilizationBuffer
        from jupyterhub_gpupool.service.writer import BatchWriter
        from jupyterhub_gpupool.store import Store
        from jupyterhub_gpupool.telemetry.agent import sim_reader

        url = f"sqlite:///{tmp_path}/pool.sqlite"
        upgrade(url)
        catalog = default_catalog()
        self.store = Store(make_engine(url), catalog)
        self.store.load_config(load_pool_config(pool_file, catalog))
        self.reader: Any = sim_reader(str(pool_file), node)
        self.sim = self.reader.nvml  # the simulated machine behind the reader
        self.writer = BatchWriter(self.store)  # the service's one write path
        self.telemetry = LocalTelemetry(
            {node: self.reader},
            self.store,
            self.writer,
            UtilizationBuffer(900),
            None,
            interval=interval,
            inventory_interval=3600,
        )
        self.mig_steps = 0
        apply_mig = self.telemetry.apply_mig

        async def counted(name: str) -> int:
            try:
                return await apply_mig(name)
            finally:
                self.mig_steps += 1

        self.telemetry.apply_mig = counted  # type: ignore[method-assign]

    def on_node(self) -> dict[tuple[str, int], tuple[str, str | None, int | None]]:
        """What the simulated NVML has: (GPU, start) → (profile, MIG uuid, processes)."""
        return {
            (g["uuid"], i["start"]): (i["profile"], i["uuid"], i["processes"])
            for g in self.reader.inventory()["gpus"]
            for i in g["mig"]["instances"]
        }

    def start(self) -> None:
        """Start the writer and the node's loop (on the running event loop)."""
        self.writer.start()
        self.telemetry.start()

    async def stop(self) -> None:
        await self.telemetry.stop()
        self.writer.stop()

    async def write(self, command: Any) -> Any:
        """A pool command, through the writer as the service runs it."""
        return await self.writer.run(command)

    def by_hand(self, action: dict[str, Any]) -> dict[str, Any]:
        """Change the node behind the pool's back (as an admin with nvidia-smi would)."""
        (result,) = self.reader.apply_mig_plan([action])
        return result

    async def until(self, check: Callable[[], T], what: str) -> T:
        """Wait, the event loop running, until ``check()`` is truthy (failing after a minute)."""
        return await wait_until_async(check, what=what, step=0.02)

    async def rounds(self, n: int) -> None:
        """Wait until the loop finished ``n`` more MIG steps from now."""
        target = self.mig_steps + n
        await self.until(lambda: self.mig_steps >= target, f"{n} more MIG steps of the loop")


# -- the hub environment ----------------------------------------------------------------------


def reconciles(env: HubEnv, admin: str) -> int:
    """How many times the service reconciled its leases with the hub (``reconciled`` events)."""
    items = request("GET", f"{env.api}/events?limit=1000", admin).json()["items"]
    return sum(e["kind"] == "reconciled" for e in items)


def wait_reconciled(env: HubEnv, before: int = 0) -> None:
    """Wait until the service has reconciled its leases with the hub at start: more than
    ``before`` ``reconciled`` audit events (count them before restarting a service), with a
    generous bound.

    The reconcile at start releases, as ``stopped``, the leases of servers the hub does not
    know, so a test that makes such leases must not begin before it. HubEnv starts the service
    before the hub: that reconcile fails once and runs again at a housekeeping round after the
    hub answers (a short ``housekeeping_interval`` keeps this wait short); a restarted service
    runs it while it already answers requests.
    """
    admin = env.token("admin")
    wait_until(
        lambda: reconciles(env, admin) > before,
        what="the service's reconcile at start",
        step=0.1,
        info=env.logs,
    )


# -- pool YAML -------------------------------------------------------------------------------


def write_pool(where: Path, text: str | None = None, name: str = "pool.yaml") -> Path:
    """Write a pool config file into ``where`` (``text``, else the shipped demo pool's) and
    return its path: a test may edit it and restart the service on it."""
    from jupyterhub_gpupool.data import data_path

    path = where / name
    path.write_text(text if text is not None else Path(data_path("demo-pool.yaml")).read_text())
    return path


# -- the reclaim rig: a moved clock, the agent played over the simulated NVML, kernels --------
#
# The reclaim end-to-end tests run a real hub, real single-user servers and the pool service
# as a process, on a clock the test moves: the pool's store, the simulated NVML, the samples'
# timestamps and the reclaimer all read :class:`ClockFile`. Hours of idleness take no real
# time. The clock runs *ahead* of the real one, so what the hub and the servers stamp on their
# own (a server's activity reports, a kernel's ``last_activity``) is always older than a window
# and never counts; the test posts the presence it means (the lab's report) and runs real
# cells for a busy kernel (:class:`KernelDriver`). The hub refuses activity more than an hour
# ahead of its clock, so presence can only be posted while the offset is under that.


class ClockFile:
    """A float clock (epoch seconds) that moves only when the test says, kept in a file so the
    pool service process reads the same time (:func:`clocked_service_python`)."""

    def __init__(self, path: Path, now: float) -> None:
        self.path = path
        self.now = now
        self._write()

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move on by ``seconds`` (never back)."""
        assert seconds >= 0
        self.now += seconds
        self._write()

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(repr(self.now))
        tmp.replace(self.path)  # atomic: a reader never sees half a number

    def ahead(self) -> float:
        """Seconds this clock is ahead of the real one."""
        return self.now - time.time()


#: Run the pool service with its store reading the time from a :class:`ClockFile`: a subclass
#: whose :meth:`PoolService.make_store` gives the store that ``clock=`` (which every decision,
#: lease time and notice is taken from).
_CLOCKED_SERVICE = """
import sys
from datetime import datetime, timezone
from pathlib import Path

from jupyterhub_gpupool.service.app import PoolService
from jupyterhub_gpupool.store import Store

CLOCK = Path({path!r})


def clock():
    return datetime.fromtimestamp(float(CLOCK.read_text()), timezone.utc).replace(tzinfo=None)


class ClockedPoolService(PoolService):
    def make_store(self, engine):
        return Store(engine, self.catalog, clock=clock, **self.store_options())


# argv: -c -m jupyterhub_gpupool.cli service ... (HubEnv runs the service so)
ClockedPoolService.launch_instance(sys.argv[4:])
"""


def clocked_service_python(clock: ClockFile) -> tuple[str, ...]:
    """``HubEnv.python`` for a pool service on ``clock`` (decisions must run in its thread:
    ``--PoolService.decisions=thread``, so the store with that clock makes them)."""
    import sys

    return (sys.executable, "-c", _CLOCKED_SERVICE.format(path=str(clock.path)))


class SimAgent:
    """The node agents of a pool YAML, played by the test over the simulated NVML on the test's
    clock: the inventory once, then samples every ``step`` seconds as the clock moves.

    ``machines[node]`` is the simulated GPU node: ``set_load(uuid, "idle" | {"pattern":
    "steady", "level": 80})`` makes a whole GPU or share busy or idle; ``add_process(mig_uuid,
    mib)`` holds memory on a MIG instance (an A100 instance then cannot say whether it works).
    """

    def __init__(self, env: HubEnv, pool_file: Path, nodes: list[str], clock: ClockFile) -> None:
        from jupyterhub_gpupool.telemetry.nvml import NvmlReader
        from jupyterhub_gpupool.telemetry.simnvml import SimNvml

        self.env, self.clock = env, clock
        self.machines = {n: SimNvml.from_yaml(str(pool_file), n, clock=clock) for n in nodes}
        self.readers = {n: NvmlReader(m, clock=clock) for n, m in self.machines.items()}
        #: nodes whose samples are not sent (their telemetry goes stale)
        self.silent: set[str] = set()

    def report_inventory(self) -> None:
        """``PUT nodes/{name}/inventory`` of every node, as an agent does on start."""
        for name, reader in self.readers.items():
            r = request(
                "PUT",
                f"{self.env.api}/nodes/{name}/inventory",
                self.env.agent_token,
                reader.inventory(),
            )
            assert r.status == 200, r.body

    def sample(self) -> None:
        """One round of samples of every node at the clock's now (``silent`` nodes skipped)."""
        for name, reader in self.readers.items():
            if name in self.silent:
                continue
            body = {"samples": reader.samples(self.clock())}
            r = request("POST", f"{self.env.api}/nodes/{name}/samples", self.env.agent_token, body)
            assert r.status == 200, r.body

    def run(self, seconds: float, step: float = 15.0) -> None:
        """Let ``seconds`` pass on the clock, sampling every ``step`` seconds, half a step
        after the start and half a step before the end: a window ``[t, t + seconds]`` holds
        its own samples only, none on its edges (which the windows before and after share)."""
        for _ in range(max(1, round(seconds / step))):
            self.clock.advance(step / 2)
            self.sample()
            self.clock.advance(step / 2)

    def mig_uuid(self, node: str, start: int) -> str:
        """The MIG UUID of the instance at ``start`` on ``node``'s first MIG GPU."""
        for gpu in self.readers[node].inventory()["gpus"]:
            for inst in gpu["mig"]["instances"]:
                if inst["start"] == start:
                    return inst["uuid"]
        raise KeyError((node, start))


class KernelDriver:
    """A kernel of a user's real single-user server, driven over its REST API and websocket
    through the proxy, as a lab tab does: start it, run a cell that keeps it busy (then close
    the socket or keep it open, as a tab left open), interrupt it."""

    def __init__(self, env: HubEnv, user: str, server: str = "") -> None:
        self.env, self.user = env, user
        self.token = env.token(user)
        self.base = f"{env.hub_url}/user/{user}/{server + '/' if server else ''}api"
        self.socket: Any = None
        self.kernel: str | None = None

    def api(self, method: str, path: str, body: object = None) -> Response:
        return request(method, f"{self.base}/{path}", self.token, body)

    def start(self) -> str:
        r = self.api("POST", "kernels", {"name": "python3"})
        assert r.status == 201, r.body
        self.kernel = r.json()["id"]  # type: ignore[index]
        self.connect()  # the server asks the new kernel for its info: it reports idle
        self.disconnect()
        wait_until(lambda: self.state() == "idle", what=f"{self.user}'s kernel to start")
        return self.kernel

    def model(self) -> dict[str, Any]:
        r = self.api("GET", f"kernels/{self.kernel}")
        assert r.status == 200, r.body
        return r.json()  # type: ignore[return-value]

    def state(self) -> str:
        return self.model()["execution_state"]

    def connect(self) -> None:
        """Open the kernel's channels websocket (a lab tab on the notebook)."""
        import websocket  # websocket-client, a jupyter-server dependency

        if self.socket is None:
            url = self.base.replace("http://", "ws://") + f"/kernels/{self.kernel}/channels"
            self.socket = websocket.create_connection(
                url, header=[f"Authorization: token {self.token}"], timeout=30
            )

    def disconnect(self) -> None:
        """Close the tab's socket (the kernel goes on with what it runs)."""
        if self.socket is not None:
            self.socket.close()
            self.socket = None
        wait_until(
            lambda: self.model()["connections"] == 0, what=f"{self.user}'s kernel's socket to go"
        )

    def execute(self, code: str, *, stay_connected: bool = False) -> None:
        """Send a cell and return once the server shows the kernel busy with it."""
        import uuid as _uuid
        from datetime import timezone

        self.connect()
        msg_id = _uuid.uuid4().hex
        self.socket.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": self.user,
                        "session": _uuid.uuid4().hex,
                        "version": "5.3",
                        "date": datetime.now(timezone.utc).isoformat(),
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "store_history": False},
                    "buffers": [],
                    "channel": "shell",
                }
            )
        )
        import websocket

        deadline = time.monotonic() + PATIENCE
        self.socket.settimeout(2)  # the server's pings would keep a longer read waiting
        while True:  # the kernel's own word that it took the cell
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{self.user}'s kernel never started the cell (busy already?)")
            try:
                msg = json.loads(self.socket.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if (
                msg.get("msg_type") == "status"
                and msg["parent_header"].get("msg_id") == msg_id
                and msg["content"]["execution_state"] == "busy"
            ):
                break
        if not stay_connected:
            self.disconnect()
        wait_until(lambda: self.state() == "busy", what=f"{self.user}'s kernel to show busy")

    def busy(self, *, stay_connected: bool = False) -> None:
        """Run a cell that computes (on the CPU) until interrupted."""
        self.execute("import time\nwhile True:\n    time.sleep(0.5)", stay_connected=stay_connected)

    def interrupt(self) -> None:
        """Interrupt the running cell and wait for the kernel to be idle again."""
        r = self.api("POST", f"kernels/{self.kernel}/interrupt")
        assert r.status == 204, r.body
        wait_until(lambda: self.state() == "idle", what=f"{self.user}'s kernel to go idle")


# -- the lab package: a JupyterLab tab played over the server extension's event stream --------


class LabTab:
    """One open JupyterLab tab as the ``jupyterlab-gpupool`` frontend behaves over HTTP: it
    holds ``GET <server>/gpupool/events?client=<id>`` open (server-sent events, read in a
    thread) and, when ``answer`` is set, answers each ``save`` event with
    ``answer(request_id) -> {"saved", "unchanged", "failed"}`` as the frontend does after
    saving its documents. ``states`` are the ``state`` events seen, newest last."""

    def __init__(
        self,
        server_url: str,
        token: str,
        answer: Callable[[str], dict[str, Any]] | None = None,
        client: str | None = None,
    ) -> None:
        import threading
        import uuid as _uuid

        self.server_url = server_url.rstrip("/")
        self.token = token
        self.answer = answer
        self.client = client or f"test-{_uuid.uuid4().hex[:10]}"
        self.states: list[dict[str, Any]] = []
        self.events: list[tuple[str, Any]] = []
        self.error: BaseException | None = None
        self._response: Any = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        wait_until(lambda: self.states or self.error, what="the first state event")
        if self.error is not None:
            raise self.error

    def _read(self) -> None:
        import urllib.request

        req = urllib.request.Request(f"{self.server_url}/gpupool/events?client={self.client}")
        req.add_header("Authorization", f"token {self.token}")
        try:
            self._response = urllib.request.urlopen(req, timeout=120)
            event, data = "message", []
            for raw in self._response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line:
                    if data:
                        self._dispatch(event, json.loads("\n".join(data)))
                    event, data = "message", []
        except BaseException as e:  # closed by close(), or the server went away
            self.error = e

    def _dispatch(self, event: str, data: Any) -> None:
        self.events.append((event, data))
        if event == "state":
            self.states.append(data)
        elif event == "save" and self.answer is not None:
            body = self.answer(data["id"])
            request(
                "POST",
                f"{self.server_url}/gpupool/save-all/{data['id']}?client={self.client}",
                self.token,
                body,
            )

    @property
    def state(self) -> dict[str, Any]:
        return self.states[-1]

    def wait_state(self, check: Callable[[dict[str, Any]], Any], what: str) -> dict[str, Any]:
        """Wait for a state event for which ``check`` holds; that state."""

        def found() -> dict[str, Any] | None:
            for s in reversed(self.states):
                if check(s):
                    return s
            return None

        return wait_until(found, what=what, step=0.1)

    def close(self) -> None:
        if self._response is not None:
            with contextlib.suppress(Exception):  # already closed
                self._response.fp.raw._sock.close()  # unblock the reading thread
            self._response.close()
        self._thread.join(10)


# -- the lab package's hub: JupyterLab servers with jupyterlab-gpupool on the pool's spawner ---

#: The pool the lab tests start servers on: an A100 in a 1g.10gb and a 3g.40gb slice (a move
#: from one to the other) and one whole H100. A test appends its own offers (indented as
#: these are) and its ``quotas:`` (and ``reclaim:``).
LAB_POOL = """
nodes:
  - name: node-a100
    gpus:
      - model: A100-80GB
        mig:
          enabled: true
          instances: [{profile: 1g.10gb, start: 0}, {profile: 3g.40gb, start: 4}]
  - name: node-h100
    gpus: [{model: H100-80GB, count: 1}]
offers:
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB],
     display_name: "A100 · 1g.10gb slice"}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB],
     display_name: "A100 · 3g.40gb slice"}
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "1× H100 80GB"}
"""


def lab_hub(
    where: Path,
    pool: str,
    *,
    lab_args: tuple[str, ...] = (),
    extra_config: str = "",
    **kw: Any,
) -> HubEnv:
    """A :class:`HubEnv` (users alice, bob, admin; the pool on SQLite in ``where``, its YAML
    ``pool``) whose servers are JupyterLab with the lab package, started by the pool's local
    spawner (:data:`SPAWNER_CONFIG`) in homes under ``where/home``.

    The lab package is set for tests: its state refreshed every second, NVML off (there are
    no GPUs here: the panel says so), a short back-off when the pool is away, and
    ``lab_args``; every server, CPU-only too, is told where the pool is. ``extra_config`` is
    more hub configuration (filled in as ``HubEnv.extra_config``); ``kw`` go to HubEnv.
    """
    options = [
        "--GPUPoolLab.interval=1",
        "--GPUPoolLab.nvml_module=",
        "--GPUPoolLab.max_backoff=4",
        *lab_args,
    ]
    lab = (
        f"c.Spawner.args = c.Spawner.args + {options!r}\n".replace("{", "{{").replace("}", "}}")
        + 'c.Spawner.environment = {{"GPUPOOL_API_URL": {api!r}}}\n'
    )
    (where / "home").mkdir(exist_ok=True)
    return HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        write_pool(where, pool),
        ("alice", "bob", "admin"),
        extra_config=SPAWNER_CONFIG + lab + extra_config,
        **kw,
    )


def user_server(env: HubEnv, user: str) -> dict[str, Any]:
    """The hub's model of ``user``'s default server (``{}``: none)."""
    r = request("GET", f"{env.hub_api}/users/{user}", env.admin_api_token)
    return r.json()["servers"].get("", {})  # type: ignore[index,union-attr]


def server_environ(env: HubEnv, user: str) -> dict[str, str]:
    """The environment of ``user``'s server process (what the spawner gave it)."""
    pid = user_server(env, user)["state"]["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def start_server(env: HubEnv, user: str, offer: str) -> None:
    """Start ``user``'s server on ``offer`` (``""``: CPU only); wait until the hub says ready."""
    r = request(
        "POST", f"{env.hub_api}/users/{user}/server", env.admin_api_token, {"gpupool_offer": offer}
    )
    assert r.status in (201, 202), r.body
    wait_until(lambda: user_server(env, user).get("ready"), 120, f"{user}'s server", info=env.logs)


def stop_server(env: HubEnv, user: str) -> None:
    """Stop ``user``'s server; wait until the hub has no server for them."""
    request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)
    wait_until(lambda: not user_server(env, user), 120, f"{user}'s server to stop", info=env.logs)


# -- a Kubernetes API server (fake, over real HTTP) ------------------------------------------

#: mig-parted configs the fake mig-manager knows: name → instances per GPU by profile.
FAKE_MIG_CONFIGS: dict[str, dict[str, int]] = {
    "all-disabled": {},
    "all-1g.10gb": {"1g.10gb": 7},
    "all-3g.40gb": {"3g.40gb": 2},
    "all-7g.80gb": {"7g.80gb": 1},
}


def kube_node(
    name: str,
    *,
    gpus: int = 1,
    product: str = "NVIDIA-A100-SXM4-80GB",
    memory_mib: int = 81920,
    config: str = "all-disabled",
    configs: dict[str, dict[str, int]] = FAKE_MIG_CONFIGS,
    cluster_labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A ``Node`` as the API server returns it for a GPU node of the GPU Operator (mixed
    strategy): gpu-feature-discovery's labels, the device plugin's allocatable, mig-manager's
    config and state labels (the shape of ``kubectl get node -o json``)."""
    node: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
            "resourceVersion": "1",
            "creationTimestamp": "2026-03-01T08:00:00Z",
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.product": product,
                "nvidia.com/gpu.count": str(gpus),
                "nvidia.com/gpu.memory": str(memory_mib),
                "nvidia.com/gpu.family": "ampere",
                "nvidia.com/mig.capable": "true",
                "nvidia.com/mig.strategy": "mixed",
                **(cluster_labels or {}),
            },
            "annotations": {"node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"podCIDR": "10.244.1.0/24"},
        "status": {
            "capacity": {"cpu": "64", "memory": "527988848Ki", "pods": "110"},
            "allocatable": {"cpu": "63500m", "memory": "517503088Ki", "pods": "110"},
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": "2026-03-02T08:59:00Z",
                    "lastTransitionTime": "2026-03-01T08:01:00Z",
                }
            ],
            "nodeInfo": {
                "kubeletVersion": "v1.33.2",
                "containerRuntimeVersion": "containerd://2.0",
            },
        },
    }
    _mig_manager_apply(node, config, configs)
    node["metadata"]["labels"]["nvidia.com/mig.config.state"] = "success"
    return node


def _mig_manager_apply(node: dict[str, Any], config: str, configs: dict[str, dict[str, int]]):
    """What mig-manager and then the device plugin and gpu-feature-discovery do to a node
    once a config is applied: MIG resources and their labels, per GPU times the GPU count."""
    labels = node["metadata"]["labels"]
    gpus = int(labels.get("nvidia.com/gpu.count", "1"))
    for key in [k for k in labels if k.startswith("nvidia.com/mig-")]:
        del labels[key]
    for where in ("capacity", "allocatable"):
        res = node["status"][where]
        for key in [k for k in res if k.startswith("nvidia.com/mig-") or k == "nvidia.com/gpu"]:
            del res[key]
    per_gpu = configs[config]
    for where in ("capacity", "allocatable"):
        res = node["status"][where]
        if per_gpu:
            for profile, n in per_gpu.items():
                res[f"nvidia.com/mig-{profile.replace('+', '.')}"] = str(n * gpus)
        else:
            res["nvidia.com/gpu"] = str(gpus)
    for profile, n in per_gpu.items():
        labels[f"nvidia.com/mig-{profile.replace('+', '.')}.count"] = str(n * gpus)
    labels["nvidia.com/mig.config"] = config


def _merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch (what the API server does with merge-patch+json)."""
    if not isinstance(patch, dict):
        return patch
    out = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = _merge_patch(out.get(key), value)
    return out


class FakeKubeAPI:
    """A Kubernetes API server for nodes, in a thread, over real HTTP (tornado).

    It speaks the API's JSON: ``NodeList``/``Node`` objects, ``Status`` errors (401 without the
    token, 404, 415 for a patch type it does not take), merge and strategic-merge patches of a
    node (``metadata.labels``, ``spec.unschedulable``), ``resourceVersion`` bumped per change,
    label selectors ``k=v``, and events with a field selector.

    A simulated **mig-manager** watches ``nvidia.com/mig.config``: once the label changes, each
    ``mig_manager_step()`` moves the node one step, as mig-manager does — the state becomes
    ``pending``; then the config is applied (``success``, the device plugin's and
    gpu-feature-discovery's MIG resources and labels rewritten), or, for a config in
    ``failing``, ``failed`` with a Warning event carrying its message. With ``auto_steps``,
    every read of the node takes one step (for a service in another process).

    For a spawner it also serves what KubeSpawner 7 calls (:func:`_workload_routes`): pods,
    PersistentVolumeClaims, Services, Secrets and Events in namespaces — create (409
    ``AlreadyExists``), read, delete (404 ``NotFound``), list with label and field selectors,
    and **watch** (``?watch=true``: newline-delimited ``WatchEvent`` JSON from a
    ``resourceVersion``, ended after ``timeoutSeconds``), as the pod reflector uses them. A
    simulated **scheduler and kubelet** run a created pod at once on a node whose labels match
    its ``nodeSelector`` and whose allocatable has its ``nvidia.com/*`` limits (``Running``,
    a pod IP, ready containers, a ``Scheduled`` event); otherwise it stays ``Pending`` with a
    ``FailedScheduling`` event, as on a real cluster. ``calls`` records every authorized
    request and ``unauthorized`` counts refused ones; ``tls=(certfile, keyfile)`` serves HTTPS.

    ``authorizer`` (``tests.fakekube_rbac.RBAC``) replaces the one token: each request is
    authenticated by its token and authorized by RBAC rules (a rendered chart's), answered 401 or
    403 with the API server's Status as a real one does.
    ``dra=tests.fakekube_dra.FakeDRA(slices)`` adds ``resource.k8s.io/v1`` (DeviceClasses,
    ResourceSlices, ResourceClaims) and allocates a pod's claims as it is scheduled.
    """

    def __init__(
        self,
        nodes: list[dict[str, Any]],
        *,
        token: str = "kube-token",
        configs: dict[str, dict[str, int]] = FAKE_MIG_CONFIGS,
        auto_steps: bool = False,
        tls: tuple[Path | str, Path | str] | None = None,
        authorizer: Any = None,
        dra: Any = None,
    ) -> None:
        self.nodes = {n["metadata"]["name"]: n for n in nodes}
        self.authorizer = authorizer
        self.token = token
        self.configs = configs
        self.auto_steps = auto_steps
        self.failing: dict[str, str] = {}  # config → the error mig-manager reports
        self.events: list[dict[str, Any]] = []
        self.patches: list[tuple[str, str, dict[str, Any]]] = []  # (node, content type, body)
        self._pending: dict[str, str] = {}  # node → config mig-manager works on
        self._lock = threading.Lock()
        self.port = free_port()
        self._loop: Any = None
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self.tls = tls
        #: pods, PVCs, services, secrets and events by (plural, namespace, name)
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        #: every authorized request of the workload routes: (method, path)
        self.calls: list[tuple[str, str]] = []
        #: requests refused for a missing or wrong bearer token
        self.unauthorized = 0
        self._rv = 1000  # the last resourceVersion handed out
        self._history: list[tuple[int, str, str, dict[str, Any]]] = []  # rv, plural, type, obj
        self._waiters: list[asyncio.Future[None]] = []  # watches waiting for a change
        self._closing = False
        #: Dynamic Resource Allocation (``tests.fakekube_dra.FakeDRA``; None: not served)
        self.dra = dra
        if dra is not None:
            dra.install(self)

    @property
    def url(self) -> str:
        """The API server's address."""
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def __enter__(self) -> FakeKubeAPI:
        ready = threading.Event()
        self._ready = ready
        self._thread.start()
        if not ready.wait(30):
            raise RuntimeError("the fake Kubernetes API did not start")
        return self

    def __exit__(self, *exc: object) -> None:
        if self._loop is not None:
            self._loop.add_callback(self._end_watches)
            self._loop.add_callback(self._loop.stop)
        self._thread.join(10)

    def _serve(self) -> None:
        import tornado.ioloop
        import tornado.web

        fake = self

        class Base(tornado.web.RequestHandler):
            def prepare(self) -> None:
                auth = self.request.headers.get("Authorization", "")
                if fake.authorizer is not None:
                    query = {k: self.get_argument(k) for k in self.request.arguments}
                    refused = fake.authorizer.check(
                        self.request.method, self.request.path, query, auth
                    )
                    if refused is not None:
                        self.status(*refused)
                elif auth != f"Bearer {fake.token}":
                    self.status(401, "Unauthorized", "Unauthorized")

            def status(
                self, code: int, reason: str, message: str, details: dict | None = None
            ) -> None:
                self.set_status(code)
                self.set_header("Content-Type", "application/json")
                self.finish(
                    {
                        "kind": "Status",
                        "apiVersion": "v1",
                        "metadata": {},
                        "status": "Failure",
                        "message": message,
                        "reason": reason,
                        **({"details": details} if details else {}),
                        "code": code,
                    }
                )

            def node_or_404(self, name: str) -> dict[str, Any] | None:
                node = fake.nodes.get(name)
                if node is None:
                    self.status(404, "NotFound", f'nodes "{name}" not found')
                return node

        class Nodes(Base):
            def get(self) -> None:
                selector = self.get_argument("labelSelector", "")
                want = dict(p.split("=", 1) for p in selector.split(",") if "=" in p)
                with fake._lock:
                    items = [
                        copy.deepcopy(n)
                        for n in fake.nodes.values()
                        if all(n["metadata"]["labels"].get(k) == v for k, v in want.items())
                    ]
                self.finish(
                    {
                        "kind": "NodeList",
                        "apiVersion": "v1",
                        "metadata": {"resourceVersion": "100"},
                        "items": items,
                    }
                )

        class OneNode(Base):
            def get(self, name: str) -> None:
                with fake._lock:
                    node = self.node_or_404(name)
                    if node is None:
                        return
                    if fake.auto_steps:
                        fake._step(name)
                    self.finish(copy.deepcopy(node))

            def patch(self, name: str) -> None:
                kind = self.request.headers.get("Content-Type", "").split(";")[0]
                if kind not in (
                    "application/merge-patch+json",
                    "application/strategic-merge-patch+json",
                ):
                    self.status(
                        415,
                        "UnsupportedMediaType",
                        "the body of the request was in "
                        "an unknown format - accepted media types include: "
                        "application/merge-patch+json, "
                        "application/strategic-merge-patch+json",
                    )
                    return
                body = json.loads(self.request.body)
                with fake._lock:
                    node = self.node_or_404(name)
                    if node is None:
                        return
                    before = node["metadata"]["labels"].get("nvidia.com/mig.config")
                    patched = _merge_patch(node, body)
                    rv = int(node["metadata"]["resourceVersion"]) + 1
                    patched["metadata"]["resourceVersion"] = str(rv)
                    fake.nodes[name] = patched
                    fake.patches.append((name, kind, body))
                    after = patched["metadata"]["labels"].get("nvidia.com/mig.config")
                    if after != before and after is not None:
                        fake._pending[name] = after
                    self.finish(copy.deepcopy(patched))

        class Events(Base):
            def get(self) -> None:
                selector = self.get_argument("fieldSelector", "")
                want = dict(p.split("=", 1) for p in selector.split(",") if "=" in p)
                with fake._lock:
                    items = [
                        e
                        for e in fake.events
                        if all(
                            e["involvedObject"].get(k.split(".", 1)[1]) == v
                            for k, v in want.items()
                        )
                    ]
                self.finish({"kind": "EventList", "apiVersion": "v1", "items": items})

        app = tornado.web.Application(
            [
                (r"/api/v1/nodes", Nodes),
                (r"/api/v1/nodes/([^/]+)", OneNode),
                (r"/api/v1/events", Events),
                *_workload_routes(fake, Base),
                *(fake.dra.routes(fake, Base) if fake.dra is not None else ()),
                fakekube_pods.cluster_pods_route(fake, Base),
            ]
        )
        asyncio.set_event_loop(asyncio.new_event_loop())
        app.listen(self.port, "127.0.0.1", ssl_options=self._ssl_context())
        self._loop = tornado.ioloop.IOLoop.current()
        self._ready.set()
        self._loop.start()

    def _step(self, name: str) -> str | None:
        """One step of mig-manager on ``name`` (lock held); the state it left."""
        config = self._pending.get(name)
        if config is None:
            return None
        node = self.nodes[name]
        labels = node["metadata"]["labels"]
        if labels.get("nvidia.com/mig.config.state") != "pending":
            labels["nvidia.com/mig.config.state"] = "pending"
            return "pending"
        del self._pending[name]
        if config in self.failing or config not in self.configs:
            labels["nvidia.com/mig.config.state"] = "failed"
            message = self.failing.get(config) or f"config {config!r} not found in the config file"
            self.events.append(
                {
                    "kind": "Event",
                    "apiVersion": "v1",
                    "metadata": {"name": f"{name}.mig{len(self.events)}", "namespace": "default"},
                    "involvedObject": {
                        "kind": "Node",
                        "name": name,
                        "uid": node["metadata"]["uid"],
                    },
                    "reason": "MigConfigFailed",
                    "message": message,
                    "type": "Warning",
                    "source": {"component": "nvidia-mig-manager"},
                    "lastTimestamp": f"2026-03-02T09:00:{len(self.events):02d}Z",
                }
            )
            return "failed"
        _mig_manager_apply(node, config, self.configs)
        labels["nvidia.com/mig.config.state"] = "success"
        return "success"

    def mig_manager_step(self, name: str) -> str | None:
        """Move mig-manager on ``name`` one step; the state it left (None: nothing to do)."""
        with self._lock:
            return self._step(name)

    def node(self, name: str) -> dict[str, Any]:
        """A copy of the node as the server has it now."""
        with self._lock:
            return copy.deepcopy(self.nodes[name])

    # -- workloads (what KubeSpawner creates, reads, lists, watches and deletes) -------------

    def _ssl_context(self) -> Any:
        """The server's TLS context (None: plain HTTP)."""
        if not self.tls:
            return None
        import ssl

        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(self.tls[0]), str(self.tls[1]))
        return context

    def _record(self, plural: str, kind: str, obj: dict[str, Any]) -> None:
        """A change (lock held): a new resourceVersion, kept for watches, watches woken."""
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        self._history.append((self._rv, plural, kind, copy.deepcopy(obj)))
        if self._loop is not None:
            self._loop.add_callback(self._notify)

    def _notify(self) -> None:
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    def _end_watches(self) -> None:
        self._closing = True
        self._notify()

    def _pod_event(self, pod: dict[str, Any], reason: str, message: str, kind: str) -> None:
        """An Event about ``pod`` (lock held), as the scheduler and kubelet post them."""
        meta = pod["metadata"]
        n = sum(1 for key in self.objects if key[0] == "events")
        event = {
            "kind": "Event",
            "apiVersion": "v1",
            "metadata": {
                "name": f"{meta['name']}.{n:016x}",
                "namespace": meta["namespace"],
                "uid": str(uuid.uuid4()),
                "creationTimestamp": "2026-03-02T09:00:00Z",
            },
            "involvedObject": {
                "kind": "Pod",
                "namespace": meta["namespace"],
                "name": meta["name"],
                "uid": meta["uid"],
                "apiVersion": "v1",
            },
            "reason": reason,
            "message": message,
            "type": kind,
            "source": {"component": "default-scheduler"},
            "firstTimestamp": f"2026-03-02T09:00:{n % 60:02d}Z",
            "lastTimestamp": f"2026-03-02T09:00:{n % 60:02d}Z",
            "count": 1,
        }
        self.objects[("events", meta["namespace"], event["metadata"]["name"])] = event
        self._record("events", "ADDED", event)

    def _schedule(self, pod: dict[str, Any]) -> None:
        """The scheduler and kubelet (lock held): run ``pod`` on a node that fits, else leave
        it Pending with the scheduler's reason."""
        spec = pod["spec"]
        selector = spec.get("nodeSelector") or {}
        claims_why = None
        for node in self.nodes.values():
            labels = node["metadata"]["labels"]
            # what the node's running pods hold is not free (tests/fakekube_pods.py)
            if all(labels.get(k) == v for k, v in selector.items()) and fakekube_pods.fits(
                self, node, pod
            ):
                if self.dra is None or not spec.get("resourceClaims"):
                    break
                claims_why = self.dra.schedule(self, pod, node["metadata"]["name"])
                if claims_why is None:
                    break
        else:
            pod["status"]["conditions"] = [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable"}
            ]
            why = (
                "node(s) didn't match Pod's node affinity/selector"
                if selector
                and not any(
                    all(n["metadata"]["labels"].get(k) == v for k, v in selector.items())
                    for n in self.nodes.values()
                )
                else "Insufficient "
                + ", ".join(sorted(fakekube_pods.gpu_requests(pod)) or ["resources"])
            )
            why = claims_why or why
            self._pod_event(
                pod,
                "FailedScheduling",
                f"0/{len(self.nodes)} nodes are available: {why}.",
                "Warning",
            )
            self._record("pods", "MODIFIED", pod)
            return
        name = node["metadata"]["name"]
        spec["nodeName"] = name
        self._pod_event(
            pod,
            "Scheduled",
            f"Successfully assigned {pod['metadata']['namespace']}/"
            f"{pod['metadata']['name']} to {name}",
            "Normal",
        )
        running = {"running": {"startedAt": "2026-03-02T09:00:05Z"}}
        pod["status"] = {
            "phase": "Running",
            "hostIP": "10.0.0.10",
            "podIP": f"10.244.1.{10 + len(self._history) % 200}",
            "startTime": "2026-03-02T09:00:01Z",
            "qosClass": "Burstable",
            "conditions": [
                {"type": t, "status": "True", "lastTransitionTime": "2026-03-02T09:00:05Z"}
                for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")
            ],
            "containerStatuses": [
                {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "containerID": f"containerd://{uuid.uuid4().hex}",
                    "ready": True,
                    "started": True,
                    "restartCount": 0,
                    "state": running,
                }
                for c in spec.get("containers", [])
            ],
        }
        self._record("pods", "MODIFIED", pod)

    def _create(self, plural: str, namespace: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create an object (None: it exists)."""
        meta = body.setdefault("metadata", {})
        key = (plural, namespace, meta.get("name", ""))
        with self._lock:
            if key in self.objects:
                return None
            meta.update(
                namespace=namespace,
                uid=str(uuid.uuid4()),
                creationTimestamp="2026-03-02T09:00:00Z",
            )
            body.setdefault("apiVersion", "v1")
            body.setdefault("kind", _KINDS[plural])
            if plural == "pods":
                body["status"] = {"phase": "Pending", "qosClass": "Burstable"}
            elif plural == "persistentvolumeclaims":
                body.setdefault("spec", {})["volumeName"] = f"pvc-{meta['uid']}"
                body["status"] = {"phase": "Bound"}
            elif plural == "services":
                body.setdefault("spec", {}).setdefault("clusterIP", "10.96.0.20")
            self.objects[key] = body
            self._record(plural, "ADDED", body)
            if plural == "pods":
                self._schedule(body)
            return copy.deepcopy(body)

    def _delete(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        with self._lock:
            obj = self.objects.pop((plural, namespace, name), None)
            if obj is None:
                return None
            obj["metadata"]["deletionTimestamp"] = "2026-03-02T10:00:00Z"
            self._record(plural, "DELETED", obj)
            if plural == "pods":
                if self.dra is not None:
                    self.dra.pod_gone(self, obj)
                fakekube_pods.retry_pending(self)  # what it held is free again
            # the garbage collector: what the object owned goes with it
            uid = obj["metadata"]["uid"]
            for key, other in list(self.objects.items()):
                owners = other["metadata"].get("ownerReferences") or []
                if any(o.get("uid") == uid for o in owners):
                    del self.objects[key]
                    self._record(key[0], "DELETED", other)
            return copy.deepcopy(obj)

    def _matching(self, plural: str, namespace: str, labels: str, fields: str) -> Callable:
        want = dict(p.split("=", 1) for p in labels.split(",") if "=" in p)
        by_field = dict(p.split("=", 1) for p in fields.split(",") if "=" in p)

        def field_of(obj: dict[str, Any], path: str) -> Any:
            for part in path.split("."):
                obj = obj.get(part) if isinstance(obj, dict) else None
            return obj

        def match(obj: dict[str, Any]) -> bool:
            meta = obj["metadata"]
            return (
                meta.get("namespace") == namespace
                and all((meta.get("labels") or {}).get(k) == v for k, v in want.items())
                and all(str(field_of(obj, k)) == v for k, v in by_field.items())
            )

        return match

    def objects_of(self, plural: str) -> dict[str, dict[str, Any]]:
        """Copies of the live objects of a kind (``pods``, ``persistentvolumeclaims``,
        ``services``, ``events``) by ``namespace/name``."""
        with self._lock:
            return {
                f"{ns}/{name}": copy.deepcopy(obj)
                for (p, ns, name), obj in self.objects.items()
                if p == plural
            }

    def terminate(self, namespace: str, pod: str, exit_code: int = 0) -> None:
        """The pod's containers exit (phase Succeeded or Failed), as the kubelet reports."""
        with self._lock:
            obj = self.objects[("pods", namespace, pod)]
            obj["status"]["phase"] = "Succeeded" if exit_code == 0 else "Failed"
            for cs in obj["status"].get("containerStatuses", []):
                cs["ready"] = False
                cs["state"] = {"terminated": {"exitCode": exit_code, "reason": "Completed"}}
            self._record("pods", "MODIFIED", obj)
            fakekube_pods.retry_pending(self)


#: The kinds of the namespaced workload routes, by plural.
_KINDS = {
    "pods": "Pod",
    "persistentvolumeclaims": "PersistentVolumeClaim",
    "services": "Service",
    "secrets": "Secret",
    "events": "Event",
}


def _workload_routes(fake: FakeKubeAPI, base: type) -> list[tuple[str, type]]:
    """The ``/api/v1/namespaces/{ns}/{plural}[/{name}]`` routes of :class:`FakeKubeAPI`."""
    plurals = "|".join(_KINDS)

    class Workload(base):  # type: ignore[misc, valid-type]
        def prepare(self) -> None:
            super().prepare()
            if self._finished:
                fake.unauthorized += 1
            else:
                fake.calls.append((self.request.method, self.request.path))

        def not_found(self, plural: str, name: str) -> None:
            self.status(404, "NotFound", f'{plural} "{name}" not found')

    class Collection(Workload):
        async def get(self, namespace: str, plural: str) -> None:
            match = fake._matching(
                plural,
                namespace,
                self.get_argument("labelSelector", ""),
                self.get_argument("fieldSelector", ""),
            )
            if self.get_argument("watch", "").lower() in ("true", "1"):
                await self.watch(plural, match)
                return
            with fake._lock:
                items = [
                    copy.deepcopy(o)
                    for (p, _, _), o in fake.objects.items()
                    if p == plural and match(o)
                ]
                rv = fake._rv
            self.finish(
                {
                    "kind": f"{_KINDS[plural]}List",
                    "apiVersion": "v1",
                    "metadata": {"resourceVersion": str(rv)},
                    "items": items,
                }
            )

        async def watch(self, plural: str, match: Callable) -> None:
            """WatchEvents after ``resourceVersion`` (all current objects for 0), one JSON
            per line, until ``timeoutSeconds`` pass or the server stops."""
            loop = asyncio.get_running_loop()
            deadline = loop.time() + float(self.get_argument("timeoutSeconds", "30"))
            since = self.get_argument("resourceVersion", "0") or "0"
            self.set_header("Content-Type", "application/json")
            with fake._lock:
                if since == "0":
                    lines = [
                        {"type": "ADDED", "object": copy.deepcopy(o)}
                        for (p, _, _), o in fake.objects.items()
                        if p == plural and match(o)
                    ]
                    sent = fake._rv
                else:
                    lines, sent = [], int(since)
            while True:
                with fake._lock:
                    for rv, p, kind, obj in fake._history:
                        if rv > sent and p == plural and match(obj):
                            lines.append({"type": kind, "object": obj})
                    sent = fake._rv
                if lines:
                    self.write("".join(json.dumps(e) + "\n" for e in lines))
                    lines = []
                    await self.flush()
                    continue  # changes made while the chunk went out
                left = deadline - loop.time()
                if fake._closing or left <= 0:
                    break
                waiter = loop.create_future()
                fake._waiters.append(waiter)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(waiter, left)
            self.finish()

        def post(self, namespace: str, plural: str) -> None:
            body = json.loads(self.request.body)
            created = fake._create(plural, namespace, body)
            if created is None:
                name = body["metadata"].get("name")
                self.status(409, "AlreadyExists", f'{plural} "{name}" already exists')
                return
            self.set_status(201)
            self.finish(created)

    class Item(Workload):
        def get(self, namespace: str, plural: str, name: str) -> None:
            with fake._lock:
                found = copy.deepcopy(fake.objects.get((plural, namespace, name)))
            if found is None:
                self.not_found(plural, name)
            else:
                self.finish(found)

        def delete(self, namespace: str, plural: str, name: str) -> None:
            gone = fake._delete(plural, namespace, name)
            if gone is None:
                self.not_found(plural, name)
            else:
                self.finish(gone)

    return [
        (rf"/api/v1/namespaces/([^/]+)/({plurals})", Collection),
        (rf"/api/v1/namespaces/([^/]+)/({plurals})/([^/]+)", Item),
    ]


def self_signed_cert(where: Path) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and its key (openssl), for a :class:`FakeKubeAPI` over
    TLS: the certificate is its own CA (``ssl_ca_cert``)."""
    import subprocess

    cert, key = where / "apiserver.crt", where / "apiserver.key"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def kubeconfig(servers: Mapping[str, FakeKubeAPI], current: str) -> dict[str, Any]:
    """A kube config (as ``kubectl config view --raw`` prints it) with one context per fake
    API server, named as in ``servers``, each with its bearer token."""
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": current,
        "clusters": [
            {
                "name": name,
                "cluster": {
                    "server": s.url,
                    **({"certificate-authority": str(s.tls[0])} if s.tls else {}),
                },
            }
            for name, s in servers.items()
        ],
        "users": [{"name": name, "user": {"token": s.token}} for name, s in servers.items()],
        "contexts": [
            {"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}
            for name in servers
        ],
    }


# -- the service in-process (chargeback, planning) --------------------------------------------


class TokenHubAuth:
    """The service's ``HubOAuth`` as the API handlers use it: a token names a hub model (the
    hub itself is the one thing these store-level API tests leave out; the integration tests
    run the real one)."""

    hub_prefix = "/hub/"
    base_url = "/services/gpupool/"
    #: No access scopes to check: the pages' own authorization (scopes on the model) decides.
    access_scopes: set[str] = set()

    def __init__(self, models: dict[str, dict[str, Any]]) -> None:
        self.models = models

    async def get_user(self, handler: Any, sync: bool = True) -> dict[str, Any] | None:
        token = handler.request.headers.get("Authorization", "").removeprefix("token ").strip()
        model = self.models.get(token)
        return None if model is None else {**model, "scopes": list(model["scopes"])}


class InProcessService:
    """The service's real tornado app and writer over ``store`` on a loopback port, on its own
    event loop in a thread; ``call`` sends one request with a token of ``models``."""

    def __init__(self, store: Store, models: dict[str, dict[str, Any]]) -> None:
        from tornado.netutil import bind_sockets

        from jupyterhub_gpupool.service.app import PoolService
        from jupyterhub_gpupool.service.metrics import PoolMetrics
        from jupyterhub_gpupool.service.utilization import MinuteAggregator, UtilizationBuffer
        from jupyterhub_gpupool.service.writer import BatchWriter

        self.store = store
        self.svc = PoolService(authenticate_prometheus=False, check_user_servers=False)
        self.svc.base_url = "/services/gpupool/"
        self.svc.store, self.svc.hub_auth, self.svc.hub = store, TokenHubAuth(models), None
        self.svc.metrics = PoolMetrics()
        store.listeners.append(self.svc.metrics.on_event)
        self.svc.utilization, self.svc.minutes = UtilizationBuffer(86400), MinuteAggregator()
        self.svc.writer = BatchWriter(store)
        self.loop = asyncio.new_event_loop()
        self.sockets = bind_sockets(0, "127.0.0.1")
        self.url = f"http://127.0.0.1:{self.sockets[0].getsockname()[1]}/services/gpupool"
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        from tornado.httpserver import HTTPServer

        asyncio.set_event_loop(self.loop)

        async def listen() -> None:
            HTTPServer(self.svc.make_app()).add_sockets(self.sockets)

        self.loop.run_until_complete(listen())
        self.loop.run_forever()

    def __enter__(self) -> InProcessService:
        self.svc.writer.start()
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.svc.writer.stop()

    def call(self, who: str | None, method: str, path: str, body: object = None) -> Response:
        """One request to ``api/v1/<path>``."""
        return request(method, f"{self.url}/api/v1/{path}", who, body)


# -- waiting out a reclaim notice on the service's own clock -----------------------------------


def wait_past_deadline(
    lease: Mapping[str, Any] | None, what: str = "the notice's deadline"
) -> None:
    """Wait until the wall clock (the service's, when it runs unmoved) is past the reclaim
    notice's deadline of ``lease`` (the lease JSON; nothing to wait for without a notice)."""
    rec = (lease or {}).get("reclaim")
    if not rec:
        return
    deadline = datetime.fromisoformat(rec["deadline"].replace("Z", "+00:00"))
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=timezone.utc)
    at = deadline.timestamp()
    wait_until(lambda: time.time() > at, 60, what, step=0.05)

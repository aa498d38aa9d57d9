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

Store and service modules are imported inside the helpers that need them, so a unit test of
the agent does not import the store.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

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
    "ROOT",
    "SPAWNER_CONFIG",
    "STORE_POOL",
    "STORE_T0",
    "Call",
    "FakeReader",
    "FakeService",
    "HubEnv",
    "Response",
    "Rig",
    "SecondsClock",
    "StoreClock",
    "WaitTimeout",
    "chp_command",
    "free_port",
    "lease_events",
    "make_agent",
    "make_instances",
    "make_store",
    "reconciles",
    "request",
    "run_for",
    "until",
    "wait_http",
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

    async def write(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """A store write, through the writer as the service makes it."""
        return await self.writer.call(getattr(self.store, method), *args, **kwargs)

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

"""The node agent and the simulated rig.

:class:`FakeReader`, :class:`FakeService`, :func:`make_agent`, :func:`run_for`: the agent loop
with no real time and no socket. :class:`Rig`: a store and the service's in-process telemetry
of one simulated node, on the test's event loop, with the simulated machine at hand.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from tests.fakes.clocks import SecondsClock
from tests.fakes.waiting import wait_until_async

if TYPE_CHECKING:
    from jupyterhub_gpupool.telemetry.agent import AgentLoop


T = TypeVar("T")

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

"""The real agent loop (tornado transport, real time) against the real hub and pool service."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from typing import Any

from jupyterhub_gpupool.telemetry.agent import AgentLoop, TornadoTransport
from tests.fakes import request, until, wait_until

NODE = "agent-node"
GPUS = ("GPU-agent-0", "GPU-agent-1")


class FakeReader:
    """Two H100s on a node the demo pool does not declare (our reader interface, no hardware)."""

    def __init__(self) -> None:
        self.reads = 0

    def inventory(self) -> dict[str, Any]:
        return {
            "cluster": "default",
            "cpu_milli": 16000,
            "memory_mib": 65536,
            "labels": {"zone": "test"},
            "gpus": [
                {"uuid": uuid, "index": i, "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}
                for i, uuid in enumerate(GPUS)
            ],
        }

    def samples(self, now: float | None = None) -> list[dict[str, Any]]:
        self.reads += 1
        ts = time.time() if now is None else now
        return [
            {"gpu": g, "start": None, "ts": ts, "util": 42.0, "memory_used_mib": 1024} for g in GPUS
        ]


def run_agent(loop_factory, done, what: str) -> AgentLoop:
    """Run a loop (built inside the event loop, as tornado's client needs) until ``done``
    (failing the test, naming ``what``, if it never is)."""

    async def main() -> AgentLoop:
        loop = loop_factory()
        await loop.run(until=until(lambda: done(loop), what=what))
        return loop

    return asyncio.run(main())


def test_agent_reports_inventory_and_samples(hub_env):
    def make() -> AgentLoop:
        return AgentLoop(
            FakeReader(),
            TornadoTransport(timeout=10),
            hub_env.api,
            NODE,
            hub_env.agent_token,
            interval=0.2,
        )

    loop = run_agent(make, lambda lp: lp.stats.sent >= 6, "six samples delivered")
    assert loop.stats.inventories == 1 and loop.stats.sent >= 6, loop.stats
    assert loop.stats.errors == loop.stats.rejected == loop.stats.dropped == 0

    admin = hub_env.token("admin")
    pool = request("GET", f"{hub_env.api}/pool", admin).json()
    nodes = {n["name"]: n for c in pool["clusters"] for n in c["nodes"]}
    assert {"sim-a100", "sim-h100", "sim-t4", NODE} <= set(nodes)
    assert [g["uuid"] for g in nodes[NODE]["gpus"]] == list(GPUS)
    assert nodes[NODE]["cpu_milli"] == 16000

    util = request("GET", f"{hub_env.api}/utilization?since=0", admin).json()
    mine = [s for s in util["samples"] if s["gpu"] in GPUS]
    assert len(mine) == loop.stats.sent
    assert {s["util"] for s in mine} == {42.0}


def test_agent_command_on_the_simulated_nvml(hub_env, demo_pool_file):
    """The command itself: simulated NVML for a node of the demo pool, stopped by SIGTERM."""
    admin = hub_env.token("admin")
    pool = request("GET", f"{hub_env.api}/pool", admin).json()
    t4 = next(n for c in pool["clusters"] for n in c["nodes"] if n["name"] == "sim-t4")
    (uuid,) = [g["uuid"] for g in t4["gpus"]]
    proc = hub_env.start_agent("sim-t4", demo_pool_file, 0.2)

    def samples() -> list:
        util = request("GET", f"{hub_env.api}/utilization?since=0", admin).json()
        return [s for s in util["samples"] if s["gpu"] == uuid]

    try:  # three samples arrived, or the agent exited (its output says why)
        wait_until(
            lambda: len(samples()) >= 3 or proc.poll() is not None,
            what="three samples from the agent command",
            step=0.2,
        )
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=15)
    assert len(samples()) >= 3, out
    assert proc.returncode == 0, out
    assert "Inventory of sim-t4 sent (1 GPUs)" in out and "Agent stopped: sent=" in out, out


def test_wrong_token_is_refused_and_logged_once(hub_env, caplog):
    caplog.set_level(logging.INFO, "jupyterhub_gpupool")
    user_token = hub_env.token("alice")  # a real token, without custom:gpupool:agent

    def make() -> AgentLoop:
        return AgentLoop(
            FakeReader(),
            TornadoTransport(timeout=10),
            hub_env.api,
            NODE,
            user_token,
            interval=0.1,
            denied_retry_interval=0.2,
        )

    loop = run_agent(make, lambda lp: lp.stats.errors >= 5, "five refused deliveries")
    assert loop.stats.errors >= 5 and loop.stats.sent == 0 and loop.stats.inventories == 0
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, errors
    assert errors[0].startswith("The agent token is not allowed: 403")
    admin = hub_env.token("admin")
    pool = request("GET", f"{hub_env.api}/pool", admin).json()
    assert NODE not in {n["name"] for c in pool["clusters"] for n in c["nodes"]}


def test_service_away_then_back_delivers_the_backlog(hub_env):
    """Samples queued while the service is down arrive, in order, once it is back."""

    async def main() -> AgentLoop:
        loop = AgentLoop(
            FakeReader(),
            TornadoTransport(timeout=5),
            hub_env.api,
            NODE,
            hub_env.agent_token,
            interval=0.1,
            backoff_base=0.1,
            backoff_max=0.5,
        )
        await loop.run(until=until(lambda: loop.stats.sent >= 2, what="two deliveries"))
        hub_env.kill_service()
        await loop.run(until=until(lambda: loop.stats.errors >= 3, what="three failed sends"))
        hub_env.start_service()  # blocks this thread until the service answers
        backlog = len(loop.queue)
        await loop.run(until=until(lambda: not loop.queue, what="the backlog delivered"))
        assert backlog > 0
        return loop

    loop = asyncio.run(main())
    assert loop.stats.errors >= 3 and not loop.queue and loop.stats.dropped == 0
    util = request("GET", f"{hub_env.api}/utilization?since=0", hub_env.token("admin")).json()
    stamps = [s["ts"] for s in util["samples"] if s["gpu"] == GPUS[0]]
    # the restarted service keeps samples in memory only: it holds what came after the restart
    assert len(stamps) >= 3 and stamps == sorted(stamps)

"""GPU kernels end to end: real ipykernels started by jupyter_client's AsyncKernelManager
through the ``gpupool-provisioner`` (found by its entry point), against the pool service's
real tornado app and writer (in-process, on the store's injectable clock; the hub's token
check played by a fake). A kernel reads its granted device from ``CUDA_VISIBLE_DEVICES``; a
second user's kernel waits in the queue with its position logged and starts when the first
shuts down; quota, an unknown offer, an unreachable pool and the queue timeout fail the start
with a clear message and leave no lease; a cancelled start gives its place up; an idle
kernel gets its notice and is shut down. What the notebook shows comes from the server's board:
a waiting start with its position (Cancel there gives the queued lease back) and the notice."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kernels.board import BOARD
from jupyterhub_gpupool.kernels.kernelspecs import spec_name, write_kernelspecs
from jupyterhub_gpupool.kernels.provisioner import GpuKernelError
from jupyterhub_gpupool.pool import commands
from tests.fakes import InProcessService, make_store
from tests.fakes.clocks import StoreClock
from tests.fakes.kernels import (
    MODELS,
    RULES,
    kernels,
    provisioner_entry_point,  # noqa: F401  (autouse, module-wide)
    run_cell,
    until,
)

POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 1}],
        }
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "display_name": "H100 80GB"}
    ],
    "quotas": {"default": {"guarantee": 0, "limit": 1}},
}
READ_ENV = "import os; print(os.environ['CUDA_VISIBLE_DEVICES'], end='')"


@pytest.fixture
def clock() -> StoreClock:
    return StoreClock()


@pytest.fixture
def svc(sqlite_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(sqlite_url)
    with InProcessService(make_store(sqlite_url, clock, POOL, kernel_rules=RULES), MODELS) as s:
        yield s


@pytest.fixture
def specs(tmp_path: Path, svc: InProcessService) -> KernelSpecManager:
    """The kernelspecs as ``jupyterhub-gpupool kernelspecs`` writes them from the offers, and
    one for an offer the pool does not have."""
    offers = svc.call("alice", "GET", "offers").json()["items"]
    assert write_kernelspecs(offers, tmp_path / "kernels") == [spec_name("h100")]
    write_kernelspecs([*offers, {"name": "gone", "kind": "gpu"}], tmp_path / "kernels")
    return KernelSpecManager(kernel_dirs=[str(tmp_path / "kernels")])


def manager(
    specs: KernelSpecManager, user: str, offer: str = "h100", **config: Any
) -> AsyncKernelManager:
    """A kernel manager for ``user``'s server (the pool's URL and the server's token in its
    environment, as a pool-spawned server has them)."""
    spec = specs.get_kernel_spec(spec_name(offer))
    spec.metadata["kernel_provisioner"]["config"].update(config)
    km = AsyncKernelManager(kernel_name=spec_name(offer), kernel_spec_manager=specs)
    km._kernel_spec = spec  # the spec with this test's extra provisioner config
    return km


@pytest.fixture
def pool_env(monkeypatch: pytest.MonkeyPatch, svc: InProcessService) -> Callable[[str], None]:
    def use(user: str, url: str | None = None) -> None:
        monkeypatch.setenv("GPUPOOL_API_URL", url or f"{svc.url}/api/v1")
        monkeypatch.setenv("JUPYTERHUB_API_TOKEN", user)

    return use


def test_kernels_get_their_gpu_and_a_second_user_waits_in_the_queue(svc, specs, pool_env, caplog):
    caplog.set_level(logging.INFO)

    async def scenario() -> None:
        pool_env("alice")
        first = manager(specs, "alice")
        await first.start_kernel()
        try:
            lease = kernels(svc, "alice")[0]
            assert lease["kernel_id"] == first.kernel_id and lease["server"].startswith("kernel:")
            device = lease["devices"][0]["gpu"]
            assert await run_cell(first, READ_ENV) == device
            assert kernels(svc, "alice")[0]["state"] == "active"  # reported at its start
            pool_env("bob")
            second = manager(specs, "bob", poll_interval=0.05)
            start = asyncio.ensure_future(second.start_kernel())
            queued = await until(
                "bob's kernel queued", lambda: [k for k in kernels(svc, "bob") if k["position"]]
            )
            assert queued[0]["position"] == 1 and queued[0]["state"] == "queued"
            await asyncio.sleep(0.2)
            assert not start.done()  # it waits, it has not failed
            assert "position 1 in the queue" in caplog.text
        finally:
            await first.shutdown_kernel(now=True)
        assert kernels(svc, "alice") == []  # shut down: released
        await asyncio.wait_for(start, 60)
        try:
            assert await run_cell(second, READ_ENV) == device
        finally:
            await second.shutdown_kernel(now=True)
        assert kernels(svc, "bob") == []

    asyncio.run(scenario())


def test_a_waiting_start_is_on_the_board_and_its_cancel_gives_the_place_up(svc, specs, pool_env):
    async def scenario() -> None:
        pool_env("alice")
        first = manager(specs, "alice")
        await first.start_kernel()
        try:
            assert BOARD.snapshot() == {"waiting": [], "notices": []}  # it did not wait
            pool_env("bob")
            second = manager(specs, "bob", poll_interval=30)  # the cancel does not wait for it
            start = asyncio.ensure_future(second.start_kernel())
            (waiting,) = await until(
                "bob's start on the board", lambda: BOARD.snapshot()["waiting"]
            )
            assert waiting["kernel_id"] == second.kernel_id and waiting["state"] == "queued"
            assert (waiting["offer"], waiting["offer_name"]) == ("h100", "H100 80GB")
            assert waiting["display_name"] == "Python 3 (GPU: H100 80GB)"
            assert waiting["kernel_name"] == spec_name("h100") and waiting["position"] == 1
            assert "eta_seconds" in waiting and waiting["lease_id"] == kernels(svc, "bob")[0]["id"]
            assert BOARD.cancel("no-such-kernel") is None
            assert BOARD.cancel(second.kernel_id) == waiting
            with pytest.raises(GpuKernelError, match="GPU kernel start cancelled") as failed:
                await asyncio.wait_for(start, 10)  # at once, not at the next look in 30 s
            assert failed.value.status_code == 409 and not second.has_kernel
            assert kernels(svc, "bob") == []  # the queued lease was given back
            r = svc.call("bob", "GET", f"kernels/{second.kernel_id}")
            assert r.json()["release_reason"] == "cancelled"
            assert BOARD.snapshot()["waiting"] == []
        finally:
            await first.shutdown_kernel(now=True)

    asyncio.run(scenario())


def test_a_restart_keeps_the_lease(svc, specs, pool_env):
    async def scenario() -> None:
        pool_env("alice")
        km = manager(specs, "alice")
        await km.start_kernel()
        try:
            before = kernels(svc, "alice")[0]["lease_id"]
            await km.restart_kernel(now=True)
            assert [k["lease_id"] for k in kernels(svc, "alice")] == [before]
        finally:
            await km.shutdown_kernel(now=True)
        assert kernels(svc, "alice") == []

    asyncio.run(scenario())


def test_refusals_fail_the_start_clearly_and_leave_no_lease(svc, specs, pool_env):
    async def fails(km: AsyncKernelManager, words: str) -> None:
        with pytest.raises(GpuKernelError, match=words):
            await km.start_kernel()
        assert not km.has_kernel

    async def scenario() -> None:
        pool_env("alice")
        held = manager(specs, "alice")
        await held.start_kernel()
        try:
            await fails(manager(specs, "alice"), "GPU quota exceeded")  # limit 1
            assert len(kernels(svc, "alice")) == 1
            await fails(manager(specs, "alice", "gone"), "no longer in the pool")
            pool_env("bob")
            await fails(
                manager(specs, "bob", queue_timeout=0.3), r"within 0.3 s \(queue position 1"
            )
            assert kernels(svc, "bob") == []
            # a start given up (the server cancels it) gives its place in the queue up
            start = asyncio.ensure_future(manager(specs, "bob", poll_interval=0.05).start_kernel())
            await until("bob queued", lambda: kernels(svc, "bob"))
            start.cancel()
            with pytest.raises(asyncio.CancelledError):
                await start
            assert kernels(svc, "bob") == []
            pool_env("bob", "http://127.0.0.1:9/api/v1")  # nothing listens there
            await fails(manager(specs, "bob"), "GPU pool is unreachable")
        finally:
            await held.shutdown_kernel(now=True)

    asyncio.run(scenario())


def test_an_idle_kernel_gets_its_notice_then_is_shut_down(svc, specs, pool_env, clock, caplog):
    def reported_at_now() -> bool:
        k = kernels(svc, "alice")
        return bool(k) and k[0]["last_report"] == clock.now.isoformat() + "Z"

    async def scenario() -> None:
        pool_env("alice")
        km = manager(specs, "alice", report_interval=0.05)
        await km.start_kernel()
        try:
            clock.advance(seconds=601)
            await until("a report after 601 s", reported_at_now)
            assert len(svc.run(commands.ReapKernels())) == 1
            await until("the notice logged", lambda: "variables will be lost" in caplog.text)
            (notice,) = BOARD.snapshot()["notices"]  # what the notebook shows
            assert notice["kernel_id"] == km.kernel_id and notice["offer_name"] == "H100 80GB"
            assert "variables will be lost" in notice["message"] and notice["deadline"]
            clock.advance(seconds=61)
            await until("a report after the deadline", reported_at_now)
            svc.run(commands.ReapKernels())
            await until("the kernel shut down", lambda: not km.has_kernel)
            assert "its GPU was released (idle)" in caplog.text
            assert BOARD.snapshot()["notices"] == []  # the kernel is gone: so is its notice
            assert kernels(svc, "alice") == []
        finally:
            if km.has_kernel:
                await km.shutdown_kernel(now=True)

    caplog.set_level(logging.INFO)
    asyncio.run(scenario())

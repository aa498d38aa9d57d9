"""What the GPU-kernel tests share: the pool's rules and users, the provisioner's entry point
as Jupyter finds it, a cell run through a kernel manager, the user's kernel leases, and a
bounded wait (tests/integration/test_gpu_kernels.py and test_gpu_kernels_kube.py)."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable, Iterator
from importlib.metadata import entry_points
from typing import Any

import pytest
from jupyter_client.manager import AsyncKernelManager

from jupyterhub_gpupool.kernels.kernelspecs import PROVISIONER
from jupyterhub_gpupool.pool.kernels import KernelRules
from jupyterhub_gpupool.service.scopes import USE

from .service import InProcessService

RULES = KernelRules(idle_timeout=600, notice=60, report_timeout=120)
MODELS = {
    u: {"kind": "user", "name": u, "scopes": [f"{USE}!user={u}"], "groups": []}
    for u in ("alice", "bob")
}


@pytest.fixture(scope="module", autouse=True)
def provisioner_entry_point(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The provisioner as Jupyter finds it: by its entry point. Where the installed package
    predates it (an editable install of another checkout), a dist-info naming this checkout's
    entry point is put on the path, as an install of it would."""
    if entry_points(group="jupyter_client.kernel_provisioners", name=PROVISIONER):
        yield
        return
    where = tmp_path_factory.mktemp("eps")
    info = where / "gpupool_kernels_test-0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: gpupool-kernels-test\nVersion: 0\n"
    )
    (info / "entry_points.txt").write_text(
        "[jupyter_client.kernel_provisioners]\n"
        f"{PROVISIONER} = jupyterhub_gpupool.kernels.provisioner:GpuPoolProvisioner\n"
    )
    sys.path.append(str(where))
    yield
    sys.path.remove(str(where))


async def run_cell(km: AsyncKernelManager, code: str) -> str:
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=60)
        out: list[str] = []

        def hook(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])

        reply = await kc.execute_interactive(code, output_hook=hook, timeout=60)
        assert reply["content"]["status"] == "ok", reply["content"]
        return "".join(out)
    finally:
        kc.stop_channels()


def kernels(svc: InProcessService, user: str) -> list[dict[str, Any]]:
    r = svc.call(user, "GET", "kernels")
    assert r.status == 200, r.body
    return list(r.json()["kernels"])


async def until(what: str, check: Callable[[], Any], bound: float = 60.0) -> Any:
    """Wait for ``check`` to hold (a generous bound: a failure, not a race)."""
    end = time.monotonic() + bound
    while time.monotonic() < end:
        got = await asyncio.to_thread(check)
        if got:
            return got
        await asyncio.sleep(0.05)
    raise AssertionError(f"not within {bound} s: {what}")

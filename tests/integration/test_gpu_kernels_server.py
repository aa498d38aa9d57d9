"""GPU kernels in a real Jupyter Server (a subprocess, as a CPU-only single-user server runs
it) against the pool service (in-process, on the store's injectable clock): the server's
kernel REST API starts a GPU kernel through the provisioner, a cell over the kernel's
websocket reads its device, the server's own activity tracking reaches the pool as ``busy``,
a refused start is the server's error with the pool's reason, and an idle kernel reclaimed by
the pool disappears from the server's kernel list (shut down through it); the variables of a
reclaimed notebook kernel come back in its next GPU kernel (those that can be pickled). The kernels
extension's ``gpupool/kernel-starts`` shows a start waiting in the queue, with its position,
and its Cancel fails the waiting start with "GPU kernel start cancelled"; a server stopped after
a refused start with a GPU kernel running stops in time (the fixture's ``wait(30)``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
from tornado.httpclient import HTTPRequest
from tornado.ioloop import IOLoop
from tornado.websocket import websocket_connect

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.kernels.kernelspecs import PROVISIONER, spec_name, write_kernelspecs
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.kernels import KernelRules
from jupyterhub_gpupool.service.scopes import USE
from tests.fakes import InProcessService, free_port, make_store, request, wait_http, wait_until
from tests.fakes.clocks import StoreClock

POOL: dict[str, Any] = {
    "nodes": [{"name": "n", "gpus": [{"model": "H100-80GB", "count": 1}]}],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
}
MODELS = {"alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"]}}
TOKEN = "server-token"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clock() -> StoreClock:
    return StoreClock()


@pytest.fixture
def svc(sqlite_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(sqlite_url)
    rules = KernelRules(idle_timeout=600, notice=60, report_timeout=120)
    with InProcessService(make_store(sqlite_url, clock, POOL, kernel_rules=rules), MODELS) as s:
        yield s


@pytest.fixture
def server(tmp_path: Path, svc: InProcessService) -> Iterator[str]:
    """``jupyter server`` with the GPU kernelspecs (fast reports) on its Jupyter path."""
    offers = request("GET", f"{svc.url}/api/v1/offers", "alice").json()["items"]  # type: ignore[index]
    write_kernelspecs([*offers, {"name": "gone", "kind": "gpu"}], tmp_path / "jp" / "kernels")
    for name in (spec_name("h100"), spec_name("gone")):
        path = tmp_path / "jp" / "kernels" / name / "kernel.json"
        spec = json.loads(path.read_text())
        spec["metadata"]["kernel_provisioner"]["config"]["report_interval"] = 0.2
        path.write_text(json.dumps(spec))
    pythonpath = [str(ROOT)]
    if not entry_points(group="jupyter_client.kernel_provisioners", name=PROVISIONER):
        info = tmp_path / "eps" / "gpupool_kernels_t-0.dist-info"  # as an install would
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: gpupool-kernels-t\nVersion: 0\n"
        )
        (info / "entry_points.txt").write_text(
            f"[jupyter_client.kernel_provisioners]\n{PROVISIONER} = "
            "jupyterhub_gpupool.kernels.provisioner:GpuPoolProvisioner\n"
        )
        pythonpath.append(str(tmp_path / "eps"))
    port = free_port()
    env = {
        **os.environ,
        "JUPYTER_PATH": str(tmp_path / "jp"),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "rt"),
        "JUPYTER_DATA_DIR": str(tmp_path / "data"),
        "PYTHONPATH": os.pathsep.join(pythonpath),
        "GPUPOOL_API_URL": f"{svc.url}/api/v1",
        "JUPYTERHUB_API_TOKEN": "alice",
    }
    (tmp_path / "work").mkdir()
    log = (tmp_path / "server.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "jupyter_server", f"--port={port}", "--ip=127.0.0.1",
         "--no-browser", "--allow-root", f"--IdentityProvider.token={TOKEN}",
         f"--ServerApp.root_dir={tmp_path / 'work'}",
         "--ServerApp.jpserver_extensions=jupyterhub_gpupool.kernels=True",
         f"--GpuKernelSpecs.folder={tmp_path / 'written'}"],
        env=env, stdout=subprocess.DEVNULL, stderr=log,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/api/status?token={TOKEN}", timeout=60, proc=proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        finally:
            if proc.poll() is None:  # the log says why it hung; the test's own failure stands
                proc.kill()
                proc.wait(10)
            log.close()


def api(url: str, method: str, path: str, body: object = None) -> Any:
    return request(method, f"{url}/api/{path}?token={TOKEN}", None, body)


def run_cell(url: str, kernel: str, code: str) -> str:
    """Execute ``code`` over the kernel's websocket (the notebook's own channel)."""

    async def go() -> str:
        ws = await websocket_connect(
            HTTPRequest(f"ws{url[4:]}/api/kernels/{kernel}/channels?token={TOKEN}")
        )
        msg_id = uuid.uuid4().hex
        header = {"msg_id": msg_id, "msg_type": "execute_request", "username": "alice",
                  "session": uuid.uuid4().hex, "version": "5.3", "date": ""}  # fmt: skip
        ws.write_message(json.dumps({
            "header": header, "parent_header": {}, "metadata": {}, "channel": "shell",
            "content": {"code": code, "silent": False, "store_history": False,
                        "user_expressions": {}, "allow_stdin": False},
        }))  # fmt: skip
        out = []
        while True:
            raw = await ws.read_message()
            assert raw is not None, "the kernel's websocket closed"
            msg = json.loads(raw)
            if msg.get("parent_header", {}).get("msg_id") != msg_id:
                continue
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
                ws.close()
                return "".join(out)

    return IOLoop.current().run_sync(go, timeout=60)


def test_a_gpu_kernel_in_a_jupyter_server(svc, server, clock):
    def pool_kernel() -> dict[str, Any]:
        return request("GET", f"{svc.url}/api/v1/kernels/{kid}", "alice").json()  # type: ignore[return-value]

    # an offer the pool no longer has: the server's error carries the pool's reason
    r = api(server, "POST", "kernels", {"name": spec_name("gone")})
    assert r.status == 404 and "no longer in the pool" in r.json()["message"]
    r = api(server, "POST", "kernels", {"name": spec_name("h100")})
    assert r.status == 201, r.body
    kid = r.json()["id"]
    lease = pool_kernel()
    assert lease["state"] == "active" and lease["kernel_id"] == kid
    device = lease["devices"][0]["gpu"]
    assert run_cell(server, kid, "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])") == (
        device + "\n"
    )
    # the server's activity tracking reaches the pool: a cell run is a busy report
    clock.advance(seconds=300)
    run_cell(server, kid, "1 + 1")
    now = clock.now.isoformat() + "Z"
    wait_until(lambda: pool_kernel()["last_busy"] == now, what="a busy report")
    # the cell's last messages (its ``idle`` status) may land after that report, so the next
    # report can still say busy: step the clock a second at a time until a report says idle
    for _ in range(10):
        clock.advance(seconds=1)
        now = clock.now.isoformat() + "Z"
        wait_until(lambda t=now: pool_kernel()["last_report"] == t, what="a report")
        if pool_kernel()["last_busy"] != now:
            break
    else:
        raise AssertionError("the kernel never reported idle after its cell")
    # idle: the notice, then the pool releases it and the server's kernel list loses it
    clock.advance(seconds=601)
    wait_until(lambda: pool_kernel()["last_report"] == clock.now.isoformat() + "Z",
               what="a report after 601 s")  # fmt: skip
    assert len(svc.run(commands.ReapKernels())) == 1
    clock.advance(seconds=61)
    wait_until(lambda: pool_kernel()["last_report"] == clock.now.isoformat() + "Z",
               what="a report after the deadline")  # fmt: skip
    svc.run(commands.ReapKernels())
    wait_until(lambda: api(server, "GET", "kernels").json() == [], what="the kernel shut down")
    assert pool_kernel()["release_reason"] == "idle"


def test_a_reclaimed_kernels_variables_come_back_in_the_notebooks_next_kernel(
    svc, server, clock, tmp_path
):
    """At the idle notice the kernel's variables are saved (a lambda, a number, a module; a
    generator cannot be and is named), saving them is not activity (the pool still reclaims),
    and the notebook's next GPU kernel has them back; a user's own shutdown keeps nothing."""

    def session() -> tuple[str, str]:
        body = {"path": "nb.ipynb", "type": "notebook", "kernel": {"name": spec_name("h100")}}
        r = api(server, "POST", "sessions", body)
        assert r.status == 201, r.body
        return r.json()["id"], r.json()["kernel"]["id"]

    def lease_of(kid: str) -> dict[str, Any]:
        return request("GET", f"{svc.url}/api/v1/kernels/{kid}", "alice").json()  # type: ignore[return-value]

    def reported_idle_at(kid: str) -> None:
        """Step the clock until a report at the new time says idle (a cell's last messages
        can land after a report)."""
        for _ in range(10):
            clock.advance(seconds=1)
            now = clock.now.isoformat() + "Z"
            wait_until(lambda t=now: lease_of(kid)["last_report"] == t, what="a report")
            if lease_of(kid)["last_busy"] != now:
                return
        raise AssertionError("the kernel never reported idle")

    log = tmp_path / "server.log"
    sid, kid = session()
    code = "x = 41\nf = lambda v: v + 1\nimport math\ng = (i for i in range(3))\nprint('ok')"
    assert run_cell(server, kid, code) == "ok\n"
    reported_idle_at(kid)
    clock.advance(seconds=601)
    wait_until(lambda: lease_of(kid)["last_report"] == clock.now.isoformat() + "Z",
               what="a report after 601 s")  # fmt: skip
    assert len(svc.run(commands.ReapKernels())) == 1  # the notice
    wait_until(lambda: "Saved for the next GPU kernel" in log.read_text(), what="the save")
    saved = log.read_text()
    assert "Saved for the next GPU kernel of this notebook: f, math, x." in saved, saved
    assert "Could not keep: g (generator" in saved
    # the notebook says it: the notice on the server's board (the lab's notification) has it
    board = request("GET", f"{server}/gpupool/kernel-starts?token={TOKEN}", None).json()
    [notice] = [n for n in board["notices"] if n["kernel_id"] == kid]  # type: ignore[index]
    assert "variables will be lost" in notice["message"]
    assert "Could not keep: g (generator" in notice["message"]
    # saving was not the user's activity: past the deadline the pool reclaims the kernel
    clock.advance(seconds=61)
    wait_until(lambda: lease_of(kid)["last_report"] == clock.now.isoformat() + "Z",
               what="a report after the deadline")  # fmt: skip
    assert lease_of(kid)["notice"] is not None
    svc.run(commands.ReapKernels())
    wait_until(lambda: lease_of(kid)["release_reason"] == "idle", what="the reclaim")
    wait_until(lambda: api(server, "GET", "kernels").json() == [], what="the kernel shut down")
    # its session went with its kernel (or goes now), as Jupyter Server ends a dead one's
    assert api(server, "DELETE", f"sessions/{sid}").status in (204, 404)
    # the notebook's next GPU kernel has its variables back
    sid, kid = session()
    wait_until(lambda: "Restored from the GPU kernel" in log.read_text(), what="the restore")
    assert run_cell(server, kid, "print(f(x), math.pi > 3)") == "42 True\n"
    assert "Could not restore" not in log.read_text()
    assert not list((tmp_path / "data" / "gpupool-kernel-state").iterdir())  # used once
    # a kernel its user shuts down keeps nothing for the next one
    assert api(server, "DELETE", f"sessions/{sid}").status == 204
    wait_until(lambda: api(server, "GET", "kernels").json() == [], what="the shutdown")
    sid, kid = session()
    assert run_cell(server, kid, "print('x' in dir())") == "False\n"


def test_a_waiting_start_is_shown_and_cancelled_through_the_server(svc, server):
    def starts() -> dict[str, Any]:
        r = request("GET", f"{server}/gpupool/kernel-starts?token={TOKEN}", None)
        assert r.status == 200, r.body
        return r.json()  # type: ignore[return-value]

    r = api(server, "POST", "kernels", {"name": spec_name("h100")})
    assert r.status == 201, r.body  # the pool's one GPU
    answer: dict[str, Any] = {}
    waiter = threading.Thread(
        target=lambda: answer.update(r=api(server, "POST", "kernels", {"name": spec_name("h100")}))
    )
    waiter.start()
    (waiting,) = wait_until(lambda: starts()["waiting"], what="the second start waiting")
    assert waiting["position"] == 1 and waiting["state"] == "queued"
    assert waiting["offer_name"] == "h100" and waiting["kernel_name"] == spec_name("h100")
    assert waiter.is_alive()  # the start waits: the notebook shows it, nothing hangs silently
    kid = waiting["kernel_id"]
    url = f"{server}/gpupool/kernel-starts/{kid}?token={TOKEN}"
    gone = request("DELETE", url, None)
    assert gone.status == 202 and gone.json()["cancelled"]["kernel_id"] == kid  # type: ignore[index]
    waiter.join(60)
    failed = answer["r"]
    assert failed.status == 409 and "GPU kernel start cancelled" in failed.json()["message"]
    assert starts() == {"waiting": [], "notices": []}
    lease = request("GET", f"{svc.url}/api/v1/kernels/{kid}", "alice").json()
    assert lease["state"] == "released" and lease["release_reason"] == "cancelled"  # type: ignore[index]
    assert len(api(server, "GET", "kernels").json()) == 1  # the first kernel runs on
    again = request("DELETE", url, None)
    assert again.status == 404 and again.json()["error"]["code"] == "not_found"  # type: ignore[index]

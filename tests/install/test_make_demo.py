"""The README's first command on a fresh clone: ``make demo`` sets up its own venv (only what
the demo installs), starts the hub with the pool on simulated GPUs, a user logs in and gets a
server holding a GPU lease; Ctrl-C (SIGINT) leaves no process of it behind."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

import pytest

from tests.demoproc import of_this_demo, running, tree, user_token
from tests.fakes import free_port, request, wait_until
from tests.freshvenv import INSTALL_PATIENCE, clean_env, installed, source_copy

pytestmark = [pytest.mark.slow, pytest.mark.install]


def of_this_clone(clone: Path) -> list[int]:
    """Live processes whose command line runs something from the clone (its venv's Python,
    its node_modules' proxy, the single-user servers)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            cmdline = (entry / "cmdline").read_bytes()
            if str(clone).encode() in cmdline and running(int(entry.name)):
                found.append(int(entry.name))
    return found


def test_make_demo_on_a_fresh_clone(tmp_path):
    clone = source_copy(tmp_path / "clone")
    port = free_port()
    env = clean_env(
        GPUPOOL_DEMO_HUB_PORT=str(free_port()),
        GPUPOOL_DEMO_SERVICE_PORT=str(free_port()),
        GPUPOOL_DEMO_PROXY_API_PORT=str(free_port()),
    )
    out = tmp_path / "make-demo.out"
    with open(out, "wb") as log:
        make = subprocess.Popen(
            ["make", "demo", f"DEMO_ARGS=--gpus sim --port {port}"],
            cwd=clone,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    url = f"http://127.0.0.1:{port}"
    state = clone / ".demo"

    def logs() -> str:
        text = out.read_text(errors="replace")[-6000:]
        hub = state / "jupyterhub.log"
        if hub.exists():
            text += "\n--- jupyterhub.log\n" + hub.read_text(errors="replace")[-6000:]
        return text

    procs: dict[int, str] = {}
    try:
        wait_until(
            lambda: "is running at" in out.read_text(errors="replace") or make.poll() is not None,
            INSTALL_PATIENCE,
            "make demo's banner",
            step=1.0,
            info=logs,
        )
        assert make.poll() is None, logs()
        # only what `make demo` installs: the demo extra and the lab package, no test tools
        have = installed(clone / ".venv" / "bin")
        assert {"jupyterhub-gpupool", "jupyterlab", "jupyterlab-gpupool"} <= have
        for absent in ("pytest", "psycopg", "numpy", "playwright"):
            assert absent not in have, f"make demo installed {absent}"

        assert request("GET", f"{url}/hub/api/").status == 200
        token = user_token(url, "alice")
        offers = request("GET", f"{url}/services/gpupool/api/v1/offers", token)
        assert offers.status == 200, offers.body
        names = {o["name"] for o in offers.json()["items"]}  # type: ignore[index]
        assert "h100" in names, names

        hub_api = f"{url}/hub/api/users/alice"
        r = request("POST", f"{hub_api}/server", token, {"user_options": {"gpupool_offer": "h100"}})
        assert r.status in (201, 202), r.body

        def ready() -> bool:
            servers = request("GET", hub_api, token).json().get("servers") or {}  # type: ignore[union-attr]
            return bool(servers.get("", {}).get("ready"))

        wait_until(ready, 300, "alice's server to be ready", step=0.5, info=logs)
        leases = request(
            "GET", f"{url}/services/gpupool/api/v1/allocations?user=alice", token
        ).json()["items"]  # type: ignore[index]
        assert [(le["offer"], le["state"]) for le in leases] == [("h100", "active")]

        procs = tree(make.pid)
        for part in ("-m jupyterhub -f", "configurable-http-proxy", "cli service", "singleuser"):
            assert any(part in cmd for cmd in procs.values()), (part, procs)
        os.killpg(make.pid, signal.SIGINT)  # Ctrl-C in the terminal: the whole group
        make.wait(180)
        wait_until(
            lambda: (
                not [p for p in procs if running(p)]
                and not of_this_demo(state)
                and not of_this_clone(clone)
            ),
            60,
            "every process of the demo to end",
            step=0.3,
            info=lambda: f"{[procs.get(p) for p in procs if running(p)]} {of_this_clone(clone)}",
        )
        assert "Stopping the demo" in out.read_text(errors="replace"), logs()
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
        for pid in [*procs, *of_this_clone(clone)]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

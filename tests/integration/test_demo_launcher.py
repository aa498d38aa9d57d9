"""``jupyterhub-gpupool demo`` as a process: one demo per folder and port, nothing left after it.

A real demo runs (simulated GPUs, the tutorial's small pool, free ports). A second launcher on
the same state folder, or on the same port from another folder, must refuse at once with one
line and leave the first untouched (JupyterHub would otherwise kill the first demo's proxy
through the pid file they share). SIGTERM to the launcher, with a user's server holding a GPU,
must end every process the demo started: hub, proxy, pool service, the server.
"""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.demoproc import (
    START_PATIENCE,
    Launched,
    finish,
    launch,
    of_this_demo,
    running,
    tree,
    user_token,
)
from tests.fakes import ROOT, request, wait_until

pytestmark = pytest.mark.slow


def assert_all_gone(launched: Launched, procs: dict[int, str]) -> None:
    """Every process of the demo ends (within a bound for hung systems, not a speed test)."""
    wait_until(
        lambda: not [p for p in procs if running(p)] and not of_this_demo(launched.state),
        30,
        "every process of the demo to end",
        step=0.2,
        info=lambda: (
            f"still running: { {p: procs.get(p) for p in procs if running(p)} } "
            f"{of_this_demo(launched.state)}"
        ),
    )
    assert "Stopping the demo" in launched.out.read_text()
    assert (launched.state / "demo.lock").read_text() == ""  # released: the next may start


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Launched]:
    launched = launch(tmp_path_factory.mktemp("launcher"))
    try:
        yield launched
    finally:
        finish(launched)


def test_a_second_demo_refuses_at_once_and_touches_nothing(demo, tmp_path):
    proxy_pid = int((demo.state / "proxy.pid").read_text())
    before = set(tree(demo.proc.pid))
    expected = f"a demo already runs at {demo.url} (pid {demo.proc.pid}); stop it with Ctrl-C"
    # the same state folder (a second `make demo`), then another folder on the same port
    for state in (demo.state, tmp_path / "other"):
        second = subprocess.run(
            demo.argv(state), cwd=ROOT, env=demo.env, capture_output=True, text=True, timeout=60
        )
        assert second.returncode == 1, second
        assert second.stdout == "", second.stdout
        lines = second.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), second.stderr
        assert 'DEMO_ARGS="--port ' in lines[0]
    assert running(proxy_pid), "the first demo's proxy was killed"
    assert set(tree(demo.proc.pid)) == before
    assert request("GET", f"{demo.url}/hub/api/").status == 200
    assert "Found proxy pid file" not in (demo.state / "jupyterhub.log").read_text()
    assert sorted(p.name for p in (tmp_path / "other").iterdir()) == ["demo.lock"]


def test_sigterm_stops_everything_the_demo_started(demo):
    token = user_token(demo.url, "alice")
    hub_api = f"{demo.url}/hub/api/users/alice"
    r = request("POST", f"{hub_api}/server", token, {"user_options": {"gpupool_offer": "h100"}})
    assert r.status in (201, 202), r.body

    def ready() -> bool:
        servers = request("GET", hub_api, token).json().get("servers") or {}
        return bool(servers.get("", {}).get("ready"))

    wait_until(
        ready,
        START_PATIENCE,
        "alice's server to be ready",
        step=0.5,
        info=demo.logs,
    )
    leases = request(
        "GET", f"{demo.url}/services/gpupool/api/v1/allocations?user=alice", token
    ).json()["items"]
    assert [le["state"] for le in leases] == ["active"]  # the server holds the H100

    procs = tree(demo.proc.pid)
    parts = ("-m jupyterhub -f", "configurable-http-proxy", "cli service", "cli job-runner")
    for part in (*parts, "singleuser"):
        assert any(part in cmd for cmd in procs.values()), (part, procs)

    demo.proc.send_signal(signal.SIGTERM)
    assert demo.proc.wait(120) == 0, demo.logs()
    assert_all_gone(demo, procs)


def test_sigint_stops_it_even_as_a_background_job(tmp_path):
    """Ctrl-C, and a shell's background job (started with SIGINT ignored) alike."""
    launched = launch(tmp_path, ignore_sigint=True)
    try:
        procs = tree(launched.proc.pid)
        assert any("configurable-http-proxy" in cmd for cmd in procs.values()), procs
        launched.proc.send_signal(signal.SIGINT)
        assert launched.proc.wait(120) == 0, launched.logs()
        assert_all_gone(launched, procs)
    finally:
        finish(launched)

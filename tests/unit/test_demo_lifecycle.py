"""The demo launcher's bookkeeping: ports that follow ``--port``, the state folder's lock, the
refusal line, and ``--fresh`` keeping the lock (tests/integration/test_demo_launcher.py runs
the real thing)."""

from __future__ import annotations

import os
import socket

import pytest

from jupyterhub_gpupool.demo import _empty
from jupyterhub_gpupool.demo.lifecycle import (
    LOCK_NAME,
    DemoRunning,
    StateLock,
    check_ports,
    demo_ports,
)
from tests.fakes import free_port


def test_ports_follow_the_public_port_unless_set():
    assert demo_ports(8000, {}) == {
        "public": 8000,
        "proxy API": 8001,
        "hub API": 8081,
        "pool service": 10101,
    }
    assert demo_ports(8010, {})["pool service"] == 10111
    assert demo_ports(8010, {"GPUPOOL_DEMO_HUB_PORT": "9999"})["hub API"] == 9999


def test_a_held_state_folder_refuses_with_one_line_naming_the_demo(tmp_path):
    first = StateLock(tmp_path / "state")
    first.acquire("http://127.0.0.1:8000", 8000)
    try:
        with pytest.raises(DemoRunning) as info:
            StateLock(tmp_path / "state").acquire("http://127.0.0.1:8000", 8000)
        line = str(info.value)
        assert line.startswith(
            f"a demo already runs at http://127.0.0.1:8000 (pid {os.getpid()}); "
            "stop it with Ctrl-C or use DEMO_ARGS="
        )
        assert '"--port 8010 --state-dir ' in line and "\n" not in line
    finally:
        first.release()
    again = StateLock(tmp_path / "state")
    again.acquire("http://127.0.0.1:8000", 8000)  # released: the next demo may start
    again.release()


def test_a_taken_port_is_named(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(DemoRunning, match=f"port {port} \\(hub API\\) on 127.0.0.1 is in use"):
            check_ports("127.0.0.1", {"public": free_port(), "hub API": port}, tmp_path)


def test_fresh_empties_the_state_folder_but_keeps_the_lock(tmp_path):
    (tmp_path / "home" / "alice").mkdir(parents=True)
    (tmp_path / "gpupool.sqlite").write_text("x")
    (tmp_path / LOCK_NAME).write_text("{}")
    _empty(tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == [LOCK_NAME]

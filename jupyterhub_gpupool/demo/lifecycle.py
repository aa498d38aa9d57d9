"""The demo's processes: one demo per state folder and port, and nothing left when it stops.

A second ``make demo`` must not start: JupyterHub would kill the first demo's proxy (it finds
the proxy's pid file in the shared state folder) and both hubs would write one database. So the
launcher holds an exclusive lock on ``<state>/demo.lock`` for its whole life (the kernel drops
it when the process dies, even by SIGKILL), with its pid and URL inside for the next one's
message; and it checks its ports before it touches anything.

Everything the demo starts (hub, proxy, pool service, users' servers and their kernels) runs
in sessions of its own, so a signal to one process group never reaches them all. The launcher
makes itself the *child subreaper* (Linux), so whatever outlives its parent is re-parented to
the launcher instead of init: on stop it finds them all as its descendants in ``/proc``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import socket
import time
from collections.abc import Iterable
from pathlib import Path
from typing import IO

try:
    import fcntl
except ImportError:  # not on Windows, where JupyterHub does not run either
    fcntl = None  # type: ignore[assignment]  # callers check for None

LOCK_NAME = "demo.lock"
PR_SET_CHILD_SUBREAPER = 36
PROC = Path("/proc")


class DemoRunning(Exception):
    """Another demo holds this state folder or one of the ports; ``str()`` is the one line
    to print."""


def demo_ports(port: int, env: dict[str, str]) -> dict[str, int]:
    """The demo's ports, which follow ``--port`` so that a second demo on another port does
    not collide: proxy API +1, hub API +81, pool service +2101 (8001, 8081, 10101 for 8000).
    ``GPUPOOL_DEMO_*_PORT`` in the environment win (the tests pick free ports)."""
    return {
        "public": port,
        "proxy API": int(env.get("GPUPOOL_DEMO_PROXY_API_PORT") or port + 1),
        "hub API": int(env.get("GPUPOOL_DEMO_HUB_PORT") or port + 81),
        "pool service": int(env.get("GPUPOOL_DEMO_SERVICE_PORT") or port + 2101),
    }


def other_demo_args(state: Path, port: int) -> str:
    """How to run a second demo beside this one: another port block and state folder."""
    other = state.with_name(f"{state.name}-{port + 10}")
    with contextlib.suppress(ValueError):
        other = other.relative_to(Path.cwd())
    return f'DEMO_ARGS="--port {port + 10} --state-dir {other}"'


def already_runs(url: str, pid: object, state: Path, port: int) -> DemoRunning:
    """The one line a second demo prints."""
    return DemoRunning(
        f"a demo already runs at {url} (pid {pid}); stop it with Ctrl-C or use "
        f"{other_demo_args(state, port)}"
    )


class StateLock:
    """The exclusive lock on a state folder, naming its holder (pid and URL) inside."""

    def __init__(self, state: Path) -> None:
        self.path = state / LOCK_NAME
        self._file: IO[str] | None = None

    def acquire(self, url: str, port: int) -> None:
        """Take the lock or raise :class:`DemoRunning` naming the demo that holds it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        f = open(self.path, "a+")  # noqa: SIM115 - held for the launcher's life
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                f.seek(0)
                try:
                    holder = json.loads(f.read() or "{}")
                except ValueError:
                    holder = {}
                f.close()
                raise already_runs(
                    holder.get("url", f"the state folder {self.path.parent}"),
                    holder.get("pid", "?"),
                    self.path.parent,
                    int(holder.get("port") or port),
                ) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "url": url, "port": port}))
        f.flush()
        self._file = f

    def release(self) -> None:
        """Empty the record and drop the lock."""
        if self._file is None:
            return
        with contextlib.suppress(OSError):
            self._file.seek(0)
            self._file.truncate()
        self._file.close()
        self._file = None


def port_in_use(ip: str, port: int) -> bool:
    """Whether something listens on ``ip:port`` already (a bind fails)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((ip, port))
        except OSError:
            return True
    return False


def demo_on_port(port: int) -> int | None:
    """The launcher (else the hub) of a demo serving ``port`` from another state folder: its
    hub's environment names the port (``/proc``; None where there is none)."""
    want = f"GPUPOOL_DEMO_PORT={port}".encode()
    found = [p for p in _pids() if want in _environ(p)]
    for pid in found:
        parent = _ppid(pid)
        if parent and _is_launcher(parent):
            return parent
    return found[0] if found else None


def _environ(pid: int) -> list[bytes]:
    try:
        return (PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return []


def stop_leftovers(state: Path) -> list[int]:
    """End processes an earlier demo of this state folder left behind (it was killed before it
    could stop them: a proxy still holding the port, say). Only called with the folder's lock
    held, so no live demo owns them; they carry ``GPUPOOL_DEMO_STATE=<state>`` from the hub."""
    want = f"GPUPOOL_DEMO_STATE={state}".encode()
    pids = [p for p in _pids() if p != os.getpid() and want in _environ(p)]
    signal_all(pids, signal.SIGTERM)
    left = wait_gone(pids, 5.0)
    signal_all(left, signal.SIGKILL)
    wait_gone(left, 5.0)
    return pids


def check_ports(ip: str, ports: dict[str, int], state: Path) -> None:
    """Raise :class:`DemoRunning` when one of the demo's ports is taken."""
    for what, port in ports.items():
        host = ip if what == "public" else "127.0.0.1"
        if not port_in_use(host, port):
            continue
        public = ports["public"]
        pid = demo_on_port(public) if what == "public" else None
        if pid is not None:
            raise already_runs(f"http://{ip}:{public}", pid, state, public)
        raise DemoRunning(
            f"port {port} ({what}) on {host} is in use by another program; "
            f"use {other_demo_args(state, public)}"
        )


def become_subreaper() -> bool:
    """Make orphaned descendants re-parent to this process (Linux ≥ 3.4); False elsewhere."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        done: bool = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        return done
    except (OSError, AttributeError):
        return False


def _pids() -> list[int]:
    try:
        return [int(p.name) for p in PROC.iterdir() if p.name.isdigit()]
    except OSError:
        return []


def _stat(pid: int) -> tuple[str, int] | None:
    """(state letter, parent pid) from ``/proc/<pid>/stat``; None when it is gone."""
    try:
        text = (PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces
    return fields[0], int(fields[1])


def _ppid(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat else None


def _is_launcher(pid: int) -> bool:
    try:
        cmdline = (PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"demo" in cmdline


def descendants(root: int | None = None) -> list[int]:
    """Every live process below ``root`` (this one by default), nearest first."""
    root = os.getpid() if root is None else root
    children: dict[int, list[int]] = {}
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[0] != "Z":
            children.setdefault(stat[1], []).append(pid)
    out: list[int] = []
    todo = list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not); reaps it when it is this process's child."""
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)
    stat = _stat(pid)
    if stat is None and not PROC.exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        return True
    return stat is not None and stat[0] != "Z"


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send ``sig`` to each process that still runs."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait up to ``timeout`` seconds for ``pids`` to end; return those still running."""
    left = list(pids)
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in left if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.2)


def stop_everything(patience: float = 10.0) -> list[int]:
    """SIGTERM every descendant, SIGKILL what still runs after ``patience`` seconds; return the
    pids that had to be killed."""
    pids = descendants()
    signal_all(pids, signal.SIGTERM)
    left = wait_gone(pids, patience)
    # what the first round started meanwhile (a server's kernel restarting), and the stragglers
    left = sorted(set(left) | set(descendants()))
    signal_all(left, signal.SIGKILL)
    wait_gone(left, 5.0)
    return left


def reap_orphans(keep: set[int]) -> None:
    """Collect the exit status of processes re-parented to this subreaper that ended (their
    zombies would pile up over a long demo); ``keep`` are children someone else waits for."""
    me = os.getpid()
    for pid in _pids():
        stat = _stat(pid)
        if stat is not None and stat[0] == "Z" and stat[1] == me and pid not in keep:
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)

"""Processes of a running demo, found through /proc, a demo user's API token, and a demo
launched on free ports: what the demo launcher's tests, the demo's jobs test and the
fresh-clone ``make demo`` test share."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import signal
import subprocess
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.fakes import ROOT, chp_command, free_port, request, wait_until


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return fields[0], int(fields[1])


def tree(root: int) -> dict[int, str]:
    """Every live process below ``root``, with its command line."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (stat := _stat(int(entry.name))) and stat[0] != "Z":
            children.setdefault(stat[1], []).append(int(entry.name))
    out, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):
            out[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        todo.extend(children.get(pid, []))
    return out


def running(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def of_this_demo(state: Path) -> list[int]:
    """Processes carrying the demo's state folder in their environment or working there."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            cwd = os.readlink(entry / "cwd")
        except OSError:
            continue
        if not running(int(entry.name)):
            continue
        if f"GPUPOOL_DEMO_STATE={state}".encode() in environ or cwd.startswith(str(state)):
            found.append(int(entry.name))
    return found


def user_token(url: str, user: str) -> str:
    """Log in through the hub's form (the demo's dummy login) and make an API token."""
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    opener.open(f"{url}/hub/login", timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    form = urllib.parse.urlencode({"username": user, "password": "any", "_xsrf": xsrf})
    opener.open(f"{url}/hub/login", form.encode(), timeout=30).read()
    xsrf = next(c.value for c in jar if c.name == "_xsrf")
    req = urllib.request.Request(
        f"{url}/hub/api/users/{user}/tokens",
        data=json.dumps({"note": "launcher test"}).encode(),
        method="POST",
        headers={"X-XSRFToken": xsrf, "Content-Type": "application/json"},
    )
    with opener.open(req, timeout=30) as r:
        return json.loads(r.read())["token"]


POOL = ROOT / "docs" / "source" / "tutorial" / "small-pool.yaml"
#: starting the hub, its proxy and the pool service on a loaded 2-core machine
START_PATIENCE = 180.0


@dataclass
class Launched:
    """A running demo launcher and what it needs to be found again."""

    proc: subprocess.Popen
    state: Path
    port: int
    out: Path
    env: dict[str, str]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def argv(self, state: Path | None = None) -> list[str]:
        return [
            *(sys.executable, "-m", "jupyterhub_gpupool.cli", "demo", "--gpus", "sim"),
            *("--pool-config", str(POOL), "--state-dir", str(state or self.state)),
            *("--port", str(self.port), "--proxy", chp_command()),
        ]

    def logs(self) -> str:
        parts = []
        for path in (self.out, self.state / "jupyterhub.log"):
            if path.exists():
                parts.append(f"--- {path.name}\n" + path.read_text(errors="replace")[-5000:])
        return "\n".join(parts)


def launch(base: Path, ignore_sigint: bool = False) -> Launched:
    """Start a demo launcher on free ports and wait until its pool service answers; with
    ``ignore_sigint`` as a shell starts a background job (SIGINT ignored)."""
    env = dict(
        os.environ,
        GPUPOOL_DEMO_HUB_PORT=str(free_port()),
        GPUPOOL_DEMO_SERVICE_PORT=str(free_port()),
        GPUPOOL_DEMO_PROXY_API_PORT=str(free_port()),
    )
    launched = Launched(None, base / "state", free_port(), base / "demo.out", env)  # type: ignore[arg-type]

    def background() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)

    with open(launched.out, "wb") as log:
        launched.proc = subprocess.Popen(
            launched.argv(),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=background if ignore_sigint else None,
        )
    try:
        wait_until(
            lambda: "is running at" in launched.out.read_text() or launched.proc.poll() is not None,
            START_PATIENCE,
            "the demo's banner",
            step=0.5,
            info=launched.logs,
        )
        assert launched.proc.poll() is None, launched.logs()
        pool = f"{launched.url}/services/gpupool/api/v1/pool"
        wait_until(lambda: request("GET", pool).status == 401, 60, "the pool service", step=0.5)
    except BaseException:
        finish(launched)
        raise
    return launched


def finish(launched: Launched) -> None:
    """Stop the launcher if a test left it running; kill whatever of its demo is left."""
    if launched.proc.poll() is None:
        launched.proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            launched.proc.wait(120)
    for pid in [*tree(launched.proc.pid), *of_this_demo(launched.state)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    if launched.proc.poll() is None:
        launched.proc.kill()
    print(launched.logs())

"""Processes of a running demo, found through /proc, and a demo user's API token: what the
demo launcher's tests and the fresh-clone ``make demo`` test share."""

from __future__ import annotations

import contextlib
import http.cookiejar
import json
import os
import urllib.parse
import urllib.request
from pathlib import Path


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

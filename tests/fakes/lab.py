"""The lab package: a JupyterLab tab and the hub its servers run on.

:class:`LabTab` plays an open tab over the server extension's event stream; :func:`lab_hub`
(JupyterLab servers with ``jupyterlab-gpupool`` on :data:`LAB_POOL`), :func:`start_server`,
:func:`stop_server`, :func:`user_server`, :func:`server_environ`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.fakes.hub import SPAWNER_CONFIG, HubEnv, request, write_pool
from tests.fakes.waiting import wait_until

# -- the lab package: a JupyterLab tab played over the server extension's event stream --------


class LabTab:
    """One open JupyterLab tab as the ``jupyterlab-gpupool`` frontend behaves over HTTP: it
    holds ``GET <server>/gpupool/events?client=<id>`` open (server-sent events, read in a
    thread) and, when ``answer`` is set, answers each ``save`` event with
    ``answer(request_id) -> {"saved", "unchanged", "failed"}`` as the frontend does after
    saving its documents. ``states`` are the ``state`` events seen, newest last."""

    def __init__(
        self,
        server_url: str,
        token: str,
        answer: Callable[[str], dict[str, Any]] | None = None,
        client: str | None = None,
    ) -> None:
        import threading
        import uuid as _uuid

        self.server_url = server_url.rstrip("/")
        self.token = token
        self.answer = answer
        self.client = client or f"test-{_uuid.uuid4().hex[:10]}"
        self.states: list[dict[str, Any]] = []
        self.events: list[tuple[str, Any]] = []
        self.error: BaseException | None = None
        self._response: Any = None
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        wait_until(lambda: self.states or self.error, what="the first state event")
        if self.error is not None:
            raise self.error

    def _read(self) -> None:
        import urllib.request

        req = urllib.request.Request(f"{self.server_url}/gpupool/events?client={self.client}")
        req.add_header("Authorization", f"token {self.token}")
        try:
            self._response = urllib.request.urlopen(req, timeout=120)
            event, data = "message", []
            for raw in self._response:
                line = raw.decode().rstrip("\n")
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].strip())
                elif not line:
                    if data:
                        self._dispatch(event, json.loads("\n".join(data)))
                    event, data = "message", []
        except BaseException as e:  # closed by close(), or the server went away
            self.error = e

    def _dispatch(self, event: str, data: Any) -> None:
        self.events.append((event, data))
        if event == "state":
            self.states.append(data)
        elif event == "save" and self.answer is not None:
            body = self.answer(data["id"])
            request(
                "POST",
                f"{self.server_url}/gpupool/save-all/{data['id']}?client={self.client}",
                self.token,
                body,
            )

    @property
    def state(self) -> dict[str, Any]:
        return self.states[-1]

    def wait_state(self, check: Callable[[dict[str, Any]], Any], what: str) -> dict[str, Any]:
        """Wait for a state event for which ``check`` holds; that state."""

        def found() -> dict[str, Any] | None:
            for s in reversed(self.states):
                if check(s):
                    return s
            return None

        return wait_until(found, what=what, step=0.1)

    def close(self) -> None:
        if self._response is not None:
            with contextlib.suppress(Exception):  # already closed
                self._response.fp.raw._sock.close()  # unblock the reading thread
            self._response.close()
        self._thread.join(10)


# -- the lab package's hub: JupyterLab servers with jupyterlab-gpupool on the pool's spawner ---

#: The pool the lab tests start servers on: an A100 in a 1g.10gb and a 3g.40gb slice (a move
#: from one to the other) and one whole H100. A test appends its own offers (indented as
#: these are) and its ``quotas:`` (and ``reclaim:``).
LAB_POOL = """
nodes:
  - name: node-a100
    gpus:
      - model: A100-80GB
        mig:
          enabled: true
          instances: [{profile: 1g.10gb, start: 0}, {profile: 3g.40gb, start: 4}]
  - name: node-h100
    gpus: [{model: H100-80GB, count: 1}]
offers:
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB],
     display_name: "A100 · 1g.10gb slice"}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB],
     display_name: "A100 · 3g.40gb slice"}
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB], display_name: "1× H100 80GB"}
"""


def lab_hub(
    where: Path,
    pool: str,
    *,
    lab_args: tuple[str, ...] = (),
    extra_config: str = "",
    **kw: Any,
) -> HubEnv:
    """A :class:`HubEnv` (users alice, bob, admin; the pool on SQLite in ``where``, its YAML
    ``pool``) whose servers are JupyterLab with the lab package, started by the pool's local
    spawner (:data:`SPAWNER_CONFIG`) in homes under ``where/home``.

    The lab package is set for tests: its state refreshed every second, NVML off (there are
    no GPUs here: the panel says so), a short back-off when the pool is away, and
    ``lab_args``; every server, CPU-only too, is told where the pool is. ``extra_config`` is
    more hub configuration (filled in as ``HubEnv.extra_config``); ``kw`` go to HubEnv.
    """
    options = [
        "--GPUPoolLab.interval=1",
        "--GPUPoolLab.nvml_module=",
        "--GPUPoolLab.max_backoff=4",
        *lab_args,
    ]
    lab = (
        f"c.Spawner.args = c.Spawner.args + {options!r}\n".replace("{", "{{").replace("}", "}}")
        + 'c.Spawner.environment = {{"GPUPOOL_API_URL": {api!r}}}\n'
    )
    (where / "home").mkdir(exist_ok=True)
    return HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        write_pool(where, pool),
        ("alice", "bob", "admin"),
        extra_config=SPAWNER_CONFIG + lab + extra_config,
        **kw,
    )


def user_server(env: HubEnv, user: str) -> dict[str, Any]:
    """The hub's model of ``user``'s default server (``{}``: none)."""
    r = request("GET", f"{env.hub_api}/users/{user}", env.admin_api_token)
    return r.json()["servers"].get("", {})  # type: ignore[index,union-attr]


def server_environ(env: HubEnv, user: str) -> dict[str, str]:
    """The environment of ``user``'s server process (what the spawner gave it)."""
    pid = user_server(env, user)["state"]["pid"]
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    return dict(item.split("=", 1) for item in raw.decode().split("\0") if "=" in item)


def start_server(env: HubEnv, user: str, offer: str) -> None:
    """Start ``user``'s server on ``offer`` (``""``: CPU only); wait until the hub says ready."""
    r = request(
        "POST", f"{env.hub_api}/users/{user}/server", env.admin_api_token, {"gpupool_offer": offer}
    )
    assert r.status in (201, 202), r.body
    wait_until(lambda: user_server(env, user).get("ready"), 120, f"{user}'s server", info=env.logs)


def stop_server(env: HubEnv, user: str) -> None:
    """Stop ``user``'s server; wait until the hub has no server for them."""
    request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)
    wait_until(lambda: not user_server(env, user), 120, f"{user}'s server to stop", info=env.logs)

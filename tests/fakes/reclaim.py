"""The reclaim rig: the agent played over the simulated NVML, kernels.

The reclaim end-to-end tests run a real hub, real single-user servers and the pool service
as a process, on a clock the test moves: the pool's store, the simulated NVML, the samples'
timestamps and the reclaimer all read :class:`ClockFile`. Hours of idleness take no real
time. The clock runs *ahead* of the real one, so what the hub and the servers stamp on their
own (a server's activity reports, a kernel's ``last_activity``) is always older than a window
and never counts; the test posts the presence it means (the lab's report) and runs real
cells for a busy kernel (:class:`KernelDriver`). The hub refuses activity more than an hour
ahead of its clock, so presence can only be posted while the offset is under that.

The moved clock, :class:`~tests.fakes.clocks.ClockFile`, and the service that reads it,
:func:`~tests.fakes.clocks.clocked_service_python`, are in :mod:`tests.fakes.clocks`.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.fakes.clocks import ClockFile
from tests.fakes.hub import HubEnv, Response, request
from tests.fakes.waiting import PATIENCE, WaitTimeout, wait_until


class SimAgent:
    """The node agents of a pool YAML, played by the test over the simulated NVML on the test's
    clock: the inventory once, then samples every ``step`` seconds as the clock moves.

    ``machines[node]`` is the simulated GPU node: ``set_load(uuid, "idle" | {"pattern":
    "steady", "level": 80})`` makes a whole GPU or share busy or idle; ``add_process(mig_uuid,
    mib)`` holds memory on a MIG instance (an A100 instance then cannot say whether it works).
    """

    def __init__(self, env: HubEnv, pool_file: Path, nodes: list[str], clock: ClockFile) -> None:
        from jupyterhub_gpupool.telemetry.nvml import NvmlReader
        from jupyterhub_gpupool.telemetry.simnvml import SimNvml

        self.env, self.clock = env, clock
        self.machines = {n: SimNvml.from_yaml(str(pool_file), n, clock=clock) for n in nodes}
        self.readers = {n: NvmlReader(m, clock=clock) for n, m in self.machines.items()}
        #: nodes whose samples are not sent (their telemetry goes stale)
        self.silent: set[str] = set()

    def report_inventory(self) -> None:
        """``PUT nodes/{name}/inventory`` of every node, as an agent does on start."""
        for name, reader in self.readers.items():
            r = request(
                "PUT",
                f"{self.env.api}/nodes/{name}/inventory",
                self.env.agent_token,
                reader.inventory(),
            )
            assert r.status == 200, r.body

    def sample(self) -> None:
        """One round of samples of every node at the clock's now (``silent`` nodes skipped)."""
        for name, reader in self.readers.items():
            if name in self.silent:
                continue
            body = {"samples": reader.samples(self.clock())}
            r = request("POST", f"{self.env.api}/nodes/{name}/samples", self.env.agent_token, body)
            assert r.status == 200, r.body

    def run(self, seconds: float, step: float = 15.0) -> None:
        """Let ``seconds`` pass on the clock, sampling every ``step`` seconds, half a step
        after the start and half a step before the end: a window ``[t, t + seconds]`` holds
        its own samples only, none on its edges (which the windows before and after share)."""
        for _ in range(max(1, round(seconds / step))):
            self.clock.advance(step / 2)
            self.sample()
            self.clock.advance(step / 2)

    def mig_uuid(self, node: str, start: int) -> str:
        """The MIG UUID of the instance at ``start`` on ``node``'s first MIG GPU."""
        for gpu in self.readers[node].inventory()["gpus"]:
            for inst in gpu["mig"]["instances"]:
                if inst["start"] == start:
                    return inst["uuid"]
        raise KeyError((node, start))


class KernelDriver:
    """A kernel of a user's real single-user server, driven over its REST API and websocket
    through the proxy, as a lab tab does: start it, run a cell that keeps it busy (then close
    the socket or keep it open, as a tab left open), interrupt it."""

    def __init__(self, env: HubEnv, user: str, server: str = "") -> None:
        self.env, self.user = env, user
        self.token = env.token(user)
        self.base = f"{env.hub_url}/user/{user}/{server + '/' if server else ''}api"
        self.socket: Any = None
        self.kernel: str | None = None

    def api(self, method: str, path: str, body: object = None) -> Response:
        return request(method, f"{self.base}/{path}", self.token, body)

    def start(self) -> str:
        r = self.api("POST", "kernels", {"name": "python3"})
        assert r.status == 201, r.body
        self.kernel = r.json()["id"]  # type: ignore[index]
        self.connect()  # the server asks the new kernel for its info: it reports idle
        self.disconnect()
        wait_until(lambda: self.state() == "idle", what=f"{self.user}'s kernel to start")
        return self.kernel

    def model(self) -> dict[str, Any]:
        r = self.api("GET", f"kernels/{self.kernel}")
        assert r.status == 200, r.body
        return r.json()  # type: ignore[return-value]

    def state(self) -> str:
        return self.model()["execution_state"]

    def connect(self) -> None:
        """Open the kernel's channels websocket (a lab tab on the notebook)."""
        import websocket  # websocket-client, a jupyter-server dependency

        if self.socket is None:
            url = self.base.replace("http://", "ws://") + f"/kernels/{self.kernel}/channels"
            self.socket = websocket.create_connection(
                url, header=[f"Authorization: token {self.token}"], timeout=30
            )

    def disconnect(self) -> None:
        """Close the tab's socket (the kernel goes on with what it runs)."""
        if self.socket is not None:
            self.socket.close()
            self.socket = None
        wait_until(
            lambda: self.model()["connections"] == 0, what=f"{self.user}'s kernel's socket to go"
        )

    def execute(self, code: str, *, stay_connected: bool = False) -> None:
        """Send a cell and return once the server shows the kernel busy with it."""
        import uuid as _uuid
        from datetime import timezone

        self.connect()
        msg_id = _uuid.uuid4().hex
        self.socket.send(
            json.dumps(
                {
                    "header": {
                        "msg_id": msg_id,
                        "msg_type": "execute_request",
                        "username": self.user,
                        "session": _uuid.uuid4().hex,
                        "version": "5.3",
                        "date": datetime.now(timezone.utc).isoformat(),
                    },
                    "parent_header": {},
                    "metadata": {},
                    "content": {"code": code, "silent": False, "store_history": False},
                    "buffers": [],
                    "channel": "shell",
                }
            )
        )
        import websocket

        deadline = time.monotonic() + PATIENCE
        self.socket.settimeout(2)  # the server's pings would keep a longer read waiting
        while True:  # the kernel's own word that it took the cell
            if time.monotonic() > deadline:
                raise WaitTimeout(f"{self.user}'s kernel never started the cell (busy already?)")
            try:
                msg = json.loads(self.socket.recv())
            except websocket.WebSocketTimeoutException:
                continue
            if (
                msg.get("msg_type") == "status"
                and msg["parent_header"].get("msg_id") == msg_id
                and msg["content"]["execution_state"] == "busy"
            ):
                break
        if not stay_connected:
            self.disconnect()
        wait_until(lambda: self.state() == "busy", what=f"{self.user}'s kernel to show busy")

    def busy(self, *, stay_connected: bool = False) -> None:
        """Run a cell that computes (on the CPU) until interrupted."""
        self.execute("import time\nwhile True:\n    time.sleep(0.5)", stay_connected=stay_connected)

    def interrupt(self) -> None:
        """Interrupt the running cell and wait for the kernel to be idle again."""
        r = self.api("POST", f"kernels/{self.kernel}/interrupt")
        assert r.status == 204, r.body
        wait_until(lambda: self.state() == "idle", what=f"{self.user}'s kernel to go idle")

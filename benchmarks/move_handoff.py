"""Server start, move and hand-off times on the demo's real processes (issue 31, must-show 5).

``jupyterhub-gpupool demo --gpus sim`` runs as a newcomer starts it: JupyterHub, the proxy, the
pool service on simulated GPUs and JupyterLab single-user servers with the lab package. Timed,
each ``--runs`` times, from the request to the first answer of the lab package's
``gpupool/state`` on the expected lease (what a lab page waits for before it follows):

* **start**: alice starts her server on an ``a100-1g`` slice (``POST /hub/api/users/alice/server``);
* **move**: alice's lab asks for the ``a100-3g`` slice (``POST /user/alice/gpupool/resize``): save
  all, reserve, and the pool restarts her server on it;
* **hand-off**: bob's CPU-only lab asks for the one H100, which alice holds, and waits in line;
  alice stops her server; timed from the pool releasing her lease (the GPU is free) to bob's
  server answering on the H100; also printed from her stop request (``handoff_from_stop``,
  which adds the holder's own stop).

Also timed, for reading the others: **stop** (``DELETE`` to the hub listing no server). A move
is a save, a stop and a start; a hand-off the waiter's CPU-only server's stop and a start (and,
from the holder's stop request, the holder's stop before them).

Goal: move and hand-off each at most server start + 2 s (medians). Prints the figures and
writes them as JSON (``benchmarks/results/move_handoff.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.demoproc import user_token  # noqa: E402
from tests.fakes import chp_command, free_port  # noqa: E402
from tests.integration.hubenv import request  # noqa: E402

#: Static MIG slices (no re-partitioning in the way) and a single H100 (a hand-off must wait).
POOL = """
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
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
  - {name: a100-3g, kind: mig, profile: 3g.40gb, models: [A100-80GB]}
  - {name: h100, kind: gpu, count: 1, models: [H100-80GB]}
quotas:
  default: {guarantee: 2, limit: 2}
"""


def wait(check: Callable[[], Any], what: str, timeout: float = 180.0, step: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(step)


class Demo:
    """The demo as a subprocess on free ports."""

    def __init__(self, where: Path) -> None:
        (where / "pool.yaml").write_text(POOL)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = dict(
            os.environ,
            GPUPOOL_DEMO_HUB_PORT=str(free_port()),
            GPUPOOL_DEMO_SERVICE_PORT=str(free_port()),
            GPUPOOL_DEMO_PROXY_API_PORT=str(free_port()),
        )
        argv = [
            *(sys.executable, "-m", "jupyterhub_gpupool.cli", "demo", "--gpus", "sim"),
            *("--pool-config", str(where / "pool.yaml"), "--state-dir", str(where / "state")),
            *("--port", str(self.port), "--proxy", chp_command()),
        ]
        self.out = where / "demo.out"
        with open(self.out, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip
        wait(lambda: "is running at" in self.out.read_text(), "the demo's banner", 120, 0.3)
        pool = f"{self.url}/services/gpupool/api/v1/pool"
        wait(lambda: request("GET", pool).status not in (404, 502, 503), "the pool", 60, 0.3)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def lab_state(demo: Demo, user: str, token: str) -> dict[str, Any] | None:
    """The lab package's state, or None while no lab answers (the hub's pages meanwhile)."""
    r = request("GET", f"{demo.url}/user/{user}/gpupool/state", token)
    try:
        return r.json() if r.status == 200 else None  # type: ignore[return-value]
    except ValueError:  # the hub's HTML page for a server that is not running
        return None


def on_lease(demo: Demo, user: str, token: str, offer: str | None) -> Callable[[], bool]:
    """Whether ``user``'s lab answers on a lease of ``offer`` (None: a CPU-only server)."""

    def check() -> bool:
        state = lab_state(demo, user, token)
        if state is None:
            return False
        lease = state.get("lease")
        return (lease or {}).get("offer") == offer if offer else lease is None

    return check


def server(demo: Demo, user: str, token: str) -> dict[str, Any]:
    r = request("GET", f"{demo.url}/hub/api/users/{user}", token)
    return r.json()["servers"].get("", {})  # type: ignore[index,union-attr]


def start(demo: Demo, user: str, token: str, offer: str) -> float:
    t0 = time.monotonic()
    r = request("POST", f"{demo.url}/hub/api/users/{user}/server", token, {"gpupool_offer": offer})
    assert r.status in (201, 202), r.body
    wait(on_lease(demo, user, token, offer or None), f"{user}'s server on {offer or 'CPU'}")
    return time.monotonic() - t0


def stop(demo: Demo, user: str, token: str) -> float:
    t0 = time.monotonic()
    request("DELETE", f"{demo.url}/hub/api/users/{user}/server", token)
    wait(lambda: not server(demo, user, token), f"{user}'s server to stop")
    return time.monotonic() - t0


def move(demo: Demo, token: str) -> float:
    t0 = time.monotonic()
    r = request("POST", f"{demo.url}/user/alice/gpupool/resize", token, {"offer": "a100-3g"})
    assert r.status == 202, r.body
    wait(on_lease(demo, "alice", token, "a100-3g"), "alice's server on the 3g slice")
    return time.monotonic() - t0


def holds_gpu(demo: Demo, token: str) -> bool:
    """Whether the token's user still holds a live lease (the pool's word)."""
    r = request("GET", f"{demo.url}/services/gpupool/api/v1/users/me", token)
    leases = r.json().get("leases") or []  # type: ignore[union-attr]
    return any(le.get("state") in ("granted", "active", "reclaiming") for le in leases)


def handoff(demo: Demo, alice: str, bob: str) -> tuple[float, float]:
    """(from alice's stop request, from the pool releasing her GPU) to bob's server answering
    on it: the first includes the holder's own stop, the second is the hand-off itself."""
    r = request("POST", f"{demo.url}/user/bob/gpupool/resize", bob, {"offer": "h100"})
    assert r.status == 202, r.body

    def queued() -> bool:
        return ((lab_state(demo, "bob", bob) or {}).get("pending") or {}).get("state") == "queued"

    wait(queued, "bob in line for the H100")
    t0 = time.monotonic()
    request("DELETE", f"{demo.url}/hub/api/users/alice/server", alice)
    released = None
    ready = on_lease(demo, "bob", bob, "h100")
    deadline = t0 + 180
    while time.monotonic() < deadline:
        if released is None and not holds_gpu(demo, alice):
            released = time.monotonic()
        if released is not None and ready():
            break
        time.sleep(0.05)
    else:
        raise TimeoutError("bob's server on the H100")
    done = time.monotonic()
    return done - t0, done - released


def _ms(values: list[float]) -> dict[str, Any]:
    return {
        "median_ms": round(1000 * statistics.median(values), 1),
        "min_ms": round(1000 * min(values), 1),
        "max_ms": round(1000 * max(values), 1),
        "runs_ms": [round(1000 * v, 1) for v in values],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="starts, moves and hand-offs each")
    parser.add_argument("--json", default=str(HERE / "results" / "move_handoff.json"))
    args = parser.parse_args(argv)
    times: dict[str, list[float]] = {
        "start": [],
        "move": [],
        "handoff": [],
        "handoff_from_stop": [],
        "stop": [],
    }
    with tempfile.TemporaryDirectory() as tmp:
        demo = Demo(Path(tmp))
        try:
            alice, bob = user_token(demo.url, "alice"), user_token(demo.url, "bob")
            start(demo, "alice", alice, "a100-1g")  # warm-up (imports, disk cache)
            stop(demo, "alice", alice)
            for i in range(args.runs):
                times["start"].append(start(demo, "alice", alice, "a100-1g"))
                times["move"].append(move(demo, alice))
                times["stop"].append(stop(demo, "alice", alice))
                start(demo, "alice", alice, "h100")
                start(demo, "bob", bob, "")
                from_stop, from_release = handoff(demo, alice, bob)
                times["handoff"].append(from_release)
                times["handoff_from_stop"].append(from_stop)
                stop(demo, "bob", bob)
                print(
                    f"run {i + 1}: start {times['start'][-1]:.2f} s, move {times['move'][-1]:.2f}"
                    f" s, hand-off {times['handoff'][-1]:.2f} s",
                    flush=True,
                )
        finally:
            demo.stop()
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cpus",
        "runs": args.runs,
        **{name: _ms(values) for name, values in times.items()},
    }
    budget = result["start"]["median_ms"] + 2000
    result["goal_ms"] = budget
    result["move_within_goal"] = result["move"]["median_ms"] <= budget
    result["handoff_within_goal"] = result["handoff"]["median_ms"] <= budget
    for name in times:
        print(f"{name:8} median {result[name]['median_ms'] / 1000:.2f} s {result[name]}")
    print(
        f"goal: move and hand-off <= start + 2 s = {budget / 1000:.2f} s: "
        f"move {'met' if result['move_within_goal'] else 'NOT met'}, "
        f"hand-off {'met' if result['handoff_within_goal'] else 'NOT met'}"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

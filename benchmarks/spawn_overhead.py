"""Spawn overhead of the pool spawner, and 50 users racing for 20 MIG slices.

Everything is real: JupyterHub with configurable-http-proxy, the pool service on simulated GPUs,
and JupyterLab single-user servers started by the local-process spawners.

1. **Overhead**: time from ``POST /users/{u}/server`` to a ready server, ``N`` spawns (and stops)
   one after the other with JupyterHub's ``SimpleLocalProcessSpawner``, then with
   ``GPUPoolSimpleLocalProcessSpawner`` asking for a MIG slice. The difference of the medians is
   the pool's overhead; the pool calls themselves (allocate, keepalive, release) are also timed
   on their own, since a JupyterLab start (seconds) is noisy next to them (milliseconds).
2. **Contention**: 50 users ask at once for ``a100-1g`` on a pool of exactly 20 slices; each holds
   its server ``--hold`` seconds, then stops it. Reports when each got its server, how long the
   last waiter waited, and checks the lease history: every user served once, no slice ever held
   by two leases at a time, nothing left held at the end.

Prints the figures and writes them as JSON (``benchmarks/results/spawn_overhead.json``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.integration.hubenv import HubEnv, request  # noqa: E402

POOL = """
nodes:
  - name: node-a
    cpu_milli: 256000
    memory_mib: 2097152
    gpus:
      - model: A100-80GB
        count: 2
        mig:
          enabled: true
          instances: [{profile: 1g.10gb, start: 0}, {profile: 1g.10gb, start: 1},
                      {profile: 1g.10gb, start: 2}, {profile: 1g.10gb, start: 3},
                      {profile: 1g.10gb, start: 4}, {profile: 1g.10gb, start: 5},
                      {profile: 1g.10gb, start: 6}]
      - model: A100-80GB
        mig:
          enabled: true
          instances: [{profile: 1g.10gb, start: 0}, {profile: 1g.10gb, start: 1},
                      {profile: 1g.10gb, start: 2}, {profile: 1g.10gb, start: 3},
                      {profile: 1g.10gb, start: 4}, {profile: 1g.10gb, start: 5}]
offers:
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
quotas:
  default: {guarantee: 0.25, limit: 1}
"""

CONFIG = """
c.JupyterHub.spawner_class = {spawner!r}
c.GPUPoolSpawnerMixin.pool_api_url = "{{api}}"
c.GPUPoolSpawnerMixin.pool_api_token = "{{spawner_token}}"
c.GPUPoolSpawnerMixin.queue_poll_interval = 0.5
c.Spawner.cmd = ["{{bin}}/jupyterhub-singleuser"]
c.Spawner.args = ["--allow-root"] if __import__("os").geteuid() == 0 else []
c.Spawner.start_timeout = 300
c.Spawner.http_timeout = 300
c.SimpleLocalProcessSpawner.home_dir_template = "{{dir}}/home/{{{{username}}}}"
c.JupyterHub.concurrent_spawn_limit = 100
"""


def _ms(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    return {
        "n": len(xs),
        "median_ms": round(statistics.median(xs) * 1000, 1),
        "p90_ms": round(xs[int(0.9 * (len(xs) - 1))] * 1000, 1),
        "min_ms": round(xs[0] * 1000, 1),
        "max_ms": round(xs[-1] * 1000, 1),
    }


def _wait(env: HubEnv, user: str, ready: bool, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = request("GET", f"{env.hub_api}/users/{user}", env.admin_api_token)
        server = r.json()["servers"].get("")  # type: ignore[index,union-attr]
        if ready and server and server.get("ready"):
            return
        if not ready and not server:
            return
        if ready and not server:
            raise RuntimeError(f"{user}'s spawn failed:\n{env.logs()}")
        time.sleep(0.05)
    raise TimeoutError(f"{user} not {'ready' if ready else 'stopped'} in {timeout}s")


def spawn_series(env: HubEnv, user: str, body: dict, n: int) -> list[float]:
    """``n`` spawns of ``user``'s server one after the other: seconds to ready each."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = request("POST", f"{env.hub_api}/users/{user}/server", env.admin_api_token, body)
        if r.status == 202:
            _wait(env, user, ready=True)
        elif r.status != 201:
            raise RuntimeError(f"spawn: {r.status} {r.body[:300]!r}\n{env.logs()}")
        times.append(time.perf_counter() - t0)
        request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)
        _wait(env, user, ready=False)
    return times


def pool_calls(env: HubEnv, n: int) -> dict[str, Any]:
    """The spawner's own pool round trips, timed apart from the server start."""
    from jupyterhub_gpupool.poolclient import PoolClient

    async def run() -> dict[str, list[float]]:
        client = PoolClient(env.api, env.spawner_token)
        out: dict[str, list[float]] = {"allocate": [], "keepalive": [], "release": []}
        for _ in range(n):
            t0 = time.perf_counter()
            lease = await client.allocate("bench", "", "a100-1g", groups=[])
            t1 = time.perf_counter()
            await client.keepalive(lease["id"])
            t2 = time.perf_counter()
            await client.release(lease["id"])
            t3 = time.perf_counter()
            out["allocate"].append(t1 - t0)
            out["keepalive"].append(t2 - t1)
            out["release"].append(t3 - t2)
        return out

    calls = asyncio.run(run())
    total = [a + b + c for a, b, c in zip(*calls.values(), strict=True)]
    return {**{k: _ms(v) for k, v in calls.items()}, "total": _ms(total)}


def contention(env: HubEnv, users: list[str], hold: float) -> dict[str, Any]:
    """All ``users`` spawn at once; each stops ``hold`` s after its server is ready."""
    t0 = time.perf_counter()
    ready_at: dict[str, float] = {}
    errors: list[str] = []

    def one(user: str) -> None:
        try:
            r = request(
                "POST",
                f"{env.hub_api}/users/{user}/server",
                env.admin_api_token,
                {"gpupool_offer": "a100-1g"},
            )
            if r.status not in (201, 202):
                raise RuntimeError(f"{r.status} {r.body[:200]!r}")
            _wait(env, user, ready=True, timeout=1800)
            ready_at[user] = time.perf_counter() - t0
            time.sleep(hold)
            request("DELETE", f"{env.hub_api}/users/{user}/server", env.admin_api_token)
            _wait(env, user, ready=False)
        except Exception as e:  # collected, reported
            errors.append(f"{user}: {e}")

    threads = [threading.Thread(target=one, args=(u,)) for u in users]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0

    leases: list[dict] = []
    offset = 0
    while True:
        r = request(
            "GET", f"{env.api}/allocations?limit=1000&offset={offset}", env.spawner_token
        ).json()
        leases += r["items"]  # type: ignore[index]
        if r["next_offset"] is None:  # type: ignore[index]
            break
        offset = r["next_offset"]  # type: ignore[index]
    ours = [le for le in leases if le["user"] in set(users)]
    granted = [le for le in ours if le["granted"]]
    # no slice held by two leases at once: per slot, the [granted, released) intervals
    by_slot: dict[tuple, list[tuple[str, str]]] = {}
    for le in granted:
        for s in le["slots"]:
            by_slot.setdefault((s["gpu"], s["start"]), []).append(
                (le["granted"], le["released"] or "9999")
            )
    overlaps = 0
    for spans in by_slot.values():
        spans.sort()
        overlaps += sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
    waits = sorted(ready_at.values())
    return {
        "users": len(users),
        "slices": 20,
        "hold_s": hold,
        "wall_s": round(wall, 1),
        "served": len(ready_at),
        "errors": errors[:5],
        "first_ready_s": round(waits[0], 1) if waits else None,
        "median_ready_s": round(statistics.median(waits), 1) if waits else None,
        "last_ready_s": round(waits[-1], 1) if waits else None,
        "leases": len(ours),
        "leases_granted": len(granted),
        "distinct_slots_used": len(by_slot),
        "double_grants": overlaps,
        "left_live": sum(1 for le in ours if le["state"] != "released"),
    }


def hub(where: Path, spawner: str, users: tuple[str, ...]) -> HubEnv:
    pool = where / "pool.yaml"
    pool.write_text(POOL)
    (where / "home").mkdir(exist_ok=True)
    return HubEnv(
        where,
        f"sqlite:///{where}/pool.sqlite",
        pool,
        users,
        service_args=("--PoolService.telemetry_source=sim",),
        extra_config=CONFIG.format(spawner=spawner),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spawns", type=int, default=20, help="sequential spawns per spawner")
    parser.add_argument("--users", type=int, default=50, help="concurrent users (contention)")
    parser.add_argument("--hold", type=float, default=5.0, help="seconds each holds its server")
    parser.add_argument("--json", default=str(HERE / "results" / "spawn_overhead.json"))
    parser.add_argument("--skip-contention", action="store_true")
    args = parser.parse_args(argv)
    users = tuple(f"u{i:02d}" for i in range(args.users))
    result: dict[str, Any] = {
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.node()} {os.cpu_count()} cpus",
        "spawns": args.spawns,
    }
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        envs = {}
        for name, spawner in (("plain", "simple"), ("gpupool", "gpupool-simple")):
            where = Path(tmp) / name
            where.mkdir()
            envs[name] = stack.enter_context(
                hub(where, spawner, ("bench", "u00", "admin")).running()
            )
        bodies = {"plain": {}, "gpupool": {"gpupool_offer": "a100-1g"}}
        times: dict[str, list[float]] = {"plain": [], "gpupool": []}
        for name in times:  # warm-up (imports, disk cache)
            spawn_series(envs[name], "u00", bodies[name], 2)
        for i in range(args.spawns):  # alternate, so machine noise hits both alike
            for name in sorted(times, reverse=bool(i % 2)):
                times[name] += spawn_series(envs[name], "u00", bodies[name], 1)
        for name in times:
            result[name] = _ms(times[name])
            print(f"{name:8} time to ready: {result[name]}", flush=True)
        result["pool_calls"] = pool_calls(envs["gpupool"], args.spawns)
        stack.close()
        result["overhead_median_ms"] = round(
            result["gpupool"]["median_ms"] - result["plain"]["median_ms"], 1
        )
        print(f"pool calls per spawn: {result['pool_calls']['total']}")
        print(f"overhead (median gpupool - median plain): {result['overhead_median_ms']} ms")
        if not args.skip_contention:
            where = Path(tmp) / "contention"
            where.mkdir()
            with hub(where, "gpupool-simple", (*users, "admin")).running() as env:
                result["contention"] = contention(env, list(users), args.hold)
            print(f"contention: {json.dumps(result['contention'])}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

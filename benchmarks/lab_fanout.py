"""The lab panel's load on the pool service: 1, 5 and 20 open tabs of one JupyterLab.

Everything is real: JupyterHub with configurable-http-proxy, the pool service on simulated GPUs,
a JupyterLab single-user server with ``jupyterlab-gpupool`` at its default settings, started by
the pool's spawner on a MIG slice. Each tab is played as the frontend behaves over HTTP (the
server extension's event stream held open, ``tests/fakes/lab.py`` ``LabTab``). For each number of
tabs the pool's own request counters (``/metrics``, by route) are read before and after
``--seconds`` of steady state; the figure is pool requests per second for that one lab. Also
measured: the same lab with no tab open (after the extension's ``idle_after``), which should
ask nothing.

Target (issue 13, item 8): under 1 request/s per open lab at default settings, whatever the
number of tabs. Prints the figures and writes ``benchmarks/results/lab_fanout.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from tests.fakes import SPAWNER_CONFIG, HubEnv, LabTab, request, wait_until, write_pool  # noqa: E402

POOL = """
nodes:
  - name: node-a100
    gpus:
      - model: A100-80GB
        mig: {enabled: true, instances: [{profile: 1g.10gb, start: 0}]}
offers:
  - {name: a100-1g, kind: mig, profile: 1g.10gb, models: [A100-80GB]}
  - {name: a100-full, kind: gpu, count: 1, models: [A100-80GB]}
quotas:
  default: {guarantee: 1, limit: 2}
"""
#: the routes the lab package asks (the rest are other parts' traffic)
LAB_ROUTES = ("user", "utilization", "offers", "allocation", "keepalive")


def counts(env: HubEnv, token: str) -> dict[str, float]:
    """The pool service's request counters by route (its /metrics)."""
    text = request("GET", env.api.replace("/api/v1", "/metrics"), token).body.decode()
    out: dict[str, float] = {}
    pattern = r"gpupool_request_duration_seconds_count\{([^}]*)\} (\S+)"
    for labels, n in re.findall(pattern, text):
        route = re.search(r'route="([^"]*)"', labels)
        if route:
            out[route.group(1)] = out.get(route.group(1), 0.0) + float(n)
    return out


def measure(env: HubEnv, admin: str, server: str, token: str, tabs: int, seconds: float) -> dict:
    opened = [LabTab(server, token) for _ in range(tabs)]
    try:
        time.sleep(2.0)  # past the first refresh every new listener may bring
        before, t0 = counts(env, admin), time.monotonic()
        time.sleep(seconds)
        after, t1 = counts(env, admin), time.monotonic()
        versions = sorted(t.state["version"] for t in opened) if opened else []
    finally:
        for t in opened:
            t.close()
    elapsed = t1 - t0
    by_route = {
        r: round((after.get(r, 0) - before.get(r, 0)) / elapsed, 3)
        for r in LAB_ROUTES
        if after.get(r, 0) - before.get(r, 0)
    }
    return {
        "tabs": tabs,
        "seconds": round(elapsed, 1),
        "requests_per_second": round(sum(by_route.values()), 3),
        "by_route": by_route,
        "tabs_saw_the_same_state": (versions[-1] - versions[0] <= 1) if versions else None,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="steady state per case")
    parser.add_argument("--tabs", default="1,5,20", help="numbers of open tabs")
    parser.add_argument("--out", default=str(HERE / "results" / "lab_fanout.json"))
    args = parser.parse_args()
    tab_counts = [int(n) for n in args.tabs.split(",")]
    with tempfile.TemporaryDirectory() as tmp_s:
        tmp = Path(tmp_s)
        (tmp / "home").mkdir()
        env = HubEnv(
            tmp,
            f"sqlite:///{tmp}/pool.sqlite",
            write_pool(tmp, POOL),
            ("alice", "admin"),
            service_args=("--PoolService.telemetry_source=sim",),
            extra_config=SPAWNER_CONFIG,
        )
        with env.running():
            r = request(
                "POST",
                f"{env.hub_api}/users/alice/server",
                env.admin_api_token,
                {"gpupool_offer": "a100-1g"},
            )
            assert r.status in (201, 202), r.body

            def ready() -> bool:
                u = request("GET", f"{env.hub_api}/users/alice", env.admin_api_token).json()
                return bool(u["servers"].get("", {}).get("ready"))  # type: ignore[index]

            wait_until(ready, 180, "alice's server")
            admin, token = env.token("admin"), env.token("alice")
            server = f"{env.hub_url}/user/alice"
            state = request("GET", f"{server}/gpupool/state", token).json()
            interval = state["interval"]  # type: ignore[index]
            results = [measure(env, admin, server, token, n, args.seconds) for n in tab_counts]
            time.sleep(35)  # past idle_after (30 s): nobody looks any more
            results.append(measure(env, admin, server, token, 0, args.seconds))
            request("DELETE", f"{env.hub_api}/users/alice/server", env.admin_api_token)
    report: dict[str, Any] = {
        "benchmark": "lab_fanout",
        "when": datetime.now().isoformat(timespec="seconds"),
        "machine": f"{platform.system()} {platform.machine()}, Python {platform.python_version()}",
        "interval_s": interval,
        "target": "< 1 pool request/s per open lab at default settings, whatever the tabs",
        "results": results,
        "met": all(r["requests_per_second"] < 1 for r in results),
    }
    print(f"Pool requests per second for one lab (interval {interval:g} s, default settings)")
    print(f"{'tabs':>5} {'req/s':>7}  by route")
    for r in results:
        routes = ", ".join(f"{k} {v}" for k, v in r["by_route"].items()) or "none"
        print(f"{r['tabs']:>5} {r['requests_per_second']:>7.3f}  {routes}")
    print("target met" if report["met"] else "TARGET MISSED")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")
    return 0 if report["met"] else 1


if __name__ == "__main__":
    sys.exit(main())

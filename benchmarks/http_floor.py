"""The HTTP limit beside ``service_load.py``'s raw SQL limit: the same client processes
(``loadclient.py``) making the same allocate + release pairs over keep-alive connections,
answered by a bare tornado application on the same machine: no hub auth, no store, no database,
no logging. Each answer is a real lease JSON, made once by the pool's ``Store`` (SQLite, the load
benchmark's pool) and re-stamped with a new id per grant.

What it tells: the server's CPU per grant is the floor of the pool service's event loop (what
tornado alone costs for those requests on this machine), and its grants/s the most these
clients and tornado reach here when nothing else competes for the cores. ``service_load.py``
reports the service's own event-loop CPU per grant beside it.

Run ``python benchmarks/http_floor.py`` (``--clients 32 --seconds 8 --warmup 2 --runs 3`` by
default); it prints one line per run, then the median, and writes JSON
(``benchmarks/results/http_floor.json``, ``--json PATH``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from loadclient import client
from service_load import ROOT, machine_busy, percentile, pool_yaml, proc_cpu

HERE = Path(__file__).resolve().parent
DEFAULT_JSON = HERE / "results" / "http_floor.json"
PREFIX = "/services/gpupool/api/v1"


def lease_answers() -> tuple[dict[str, Any], dict[str, Any]]:
    """A grant's and its release's JSON as the pool service answers them (one real
    allocate + release through ``Store`` on a throw-away SQLite database)."""
    sys.path.insert(0, str(ROOT))
    import yaml

    from jupyterhub_gpupool.dbutil import make_engine, upgrade
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import parse_pool_config
    from jupyterhub_gpupool.service.serialize.leases import lease_json
    from jupyterhub_gpupool.store import Store

    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{tmp}/pool.sqlite"
        upgrade(url)
        catalog = default_catalog()
        store = Store(make_engine(url), catalog)
        store.load_config(parse_pool_config(yaml.safe_load(pool_yaml()), catalog))
        granted = lease_json(store.allocate("bench0", "s0", "h100"))
        released = lease_json(store.release(granted["id"]))
        store.engine.dispose()
    return granted, released


def serve(port: int, granted: dict[str, Any], released: dict[str, Any], ready: Any) -> None:
    """The server process: answer POST allocations and DELETE allocations/{id} with the
    lease JSONs (a new id and the caller's user and server per grant)."""
    import tornado.web

    class Allocations(tornado.web.RequestHandler):
        def post(self) -> None:
            body = json.loads(self.request.body)
            answer = {**granted, "id": uuid.uuid4().hex}
            answer["user"], answer["server"] = body["user"], body["server"]
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.set_status(201)
            self.finish(json.dumps(answer))

    class Allocation(tornado.web.RequestHandler):
        def delete(self, lease_id: str) -> None:
            self.set_header("Content-Type", "application/json; charset=utf-8")
            self.finish(json.dumps({**released, "id": lease_id}))

    async def main() -> None:
        app = tornado.web.Application(
            [(f"{PREFIX}/allocations", Allocations), (f"{PREFIX}/allocations/(\\w+)", Allocation)],
            log_function=lambda _handler: None,
        )
        app.listen(port, "127.0.0.1", xheaders=True)
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def run(args: argparse.Namespace, granted: dict[str, Any], released: dict[str, Any]) -> dict:
    """One run: a fresh server process and ``args.clients`` client processes."""
    from tests.integration.hubenv import free_port  # ROOT is on sys.path (lease_answers)

    ctx = mp.get_context("spawn")
    port, ready, out = free_port(), ctx.Event(), ctx.Queue()
    server = ctx.Process(target=serve, args=(port, granted, released, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the HTTP floor's server did not start")
        api = f"http://127.0.0.1:{port}{PREFIX}"
        start_at = time.time() + 1.0 + 0.05 * args.clients
        clients = [
            ctx.Process(
                target=client,
                args=(w, api, "floor", start_at, args.warmup, args.seconds, None, out),
            )
            for w in range(args.clients)
        ]
        for p in clients:
            p.start()
        while time.time() < start_at + args.warmup:
            time.sleep(0.005)
        cpu0, (busy0, _) = proc_cpu(server.pid), machine_busy()
        t0 = time.time()
        results = [out.get(timeout=args.seconds * 20 + 600) for _ in clients]
        wall = time.time() - t0
        cpu1, (busy1, _) = proc_cpu(server.pid), machine_busy()
        for p in clients:
            p.join(30)
    finally:
        server.kill()
        server.join(10)
    firsts = [r["first"] for r in results if r["first"] is not None]
    lasts = [r["last"] for r in results if r["last"] is not None]
    span = (max(lasts) - min(firsts)) if firsts and lasts else 0.0
    pairs = sum(len(r["pair_ms"]) for r in results)
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])

    def pct(key: str, q: float) -> float | None:
        value = percentile([x for r in results for x in r[key]], q)
        return None if value is None else round(value, 2)

    return {
        "clients": args.clients,
        "grants": pairs,
        "grants_per_s": round(pairs / span, 1) if span else 0.0,
        "post_ms": {"p50": pct("post_ms", 50), "p99": pct("post_ms", 99)},
        "delete_ms": {"p50": pct("delete_ms", 50), "p99": pct("delete_ms", 99)},
        "server_cpu_ms_per_grant": round(1000 * (cpu1 - cpu0) / pairs, 3) if pairs else None,
        "cores": {
            "server": round((cpu1 - cpu0) / wall, 3) if wall else None,
            "clients": round(sum(r["cpu_s"] for r in results) / wall, 3) if wall else None,
            "machine": round((busy1 - busy0) / wall, 3) if wall else None,
        },
        "errors": dict(errors),
    }


HEADER = (
    f"{'clients':>7}  {'grants/s':>9}  {'POST p50':>8} {'p99':>6}  {'DELETE p50':>10} {'p99':>6}"
    f"  {'server ms/grant':>15}  {'cores: server':>13} {'clients':>7} {'box':>5}  errors"
)


def line(r: dict[str, Any]) -> str:
    c = r["cores"]
    return (
        f"{r['clients']:>7}  {r['grants_per_s']:>9.1f}  {r['post_ms']['p50']:>8} "
        f"{r['post_ms']['p99']:>6}  {r['delete_ms']['p50']:>10} {r['delete_ms']['p99']:>6}  "
        f"{r['server_cpu_ms_per_grant']:>15}  {c['server']:>13} {c['clients']:>7} "
        f"{c['machine']:>5}  {sum(r['errors'].values())}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=32, help="client processes")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured seconds per run")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--runs", type=int, default=3, help="runs (the median is reported)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where the JSON goes")
    args = parser.parse_args(argv)
    if args.clients < 1 or args.seconds <= 0 or args.warmup < 0 or args.runs < 1:
        parser.error("--clients and --runs must be >= 1, --seconds > 0, --warmup >= 0")
    granted, released = lease_answers()
    print(
        f"HTTP floor: bare tornado answering the pool's lease JSON ({len(json.dumps(granted))} "
        f"bytes per grant); {args.seconds:g}s per run after {args.warmup:g}s warm-up; "
        f"{os.cpu_count()} CPUs"
    )
    print(HEADER)
    runs = []
    for _ in range(args.runs):
        runs.append(run(args, granted, released))
        print(line(runs[-1]), flush=True)
    median = {
        "grants_per_s": statistics.median(r["grants_per_s"] for r in runs),
        "server_cpu_ms_per_grant": statistics.median(
            r["server_cpu_ms_per_grant"] for r in runs if r["server_cpu_ms_per_grant"]
        ),
    }
    print(
        f"median of {len(runs)}: {median['grants_per_s']:.1f} grants/s, the server's CPU "
        f"{median['server_cpu_ms_per_grant']:.3f} ms per grant (the floor of the service's "
        "event loop)"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "benchmark": "http_floor",
                "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
                "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "runs": runs,
                "median": median,
            },
            indent=1,
        )
    )
    print(f"saved {args.json}")
    return 1 if any(r["errors"] for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())

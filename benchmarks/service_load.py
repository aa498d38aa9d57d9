"""Service load benchmark: allocate + release through the real pool service on loopback.

The issue's target is >= 300 grants/s with p99 <= 50 ms at 32 concurrent clients on PostgreSQL.

For each database (SQLite file, fresh PostgreSQL database) the benchmark starts a real JupyterHub
(with configurable-http-proxy) and the pool service as an external hub service, exactly as the
integration tests do (``tests/integration/hubenv.py``), with a pool big enough that nothing ever
queues (64 nodes x 8 whole H100s = 512 GPUs), so what it measures is grants. Then, for each client
count, that many client *processes* each loop ``POST allocations`` (a grant) -> ``DELETE
allocations/{id}`` (its release) over one keep-alive HTTP/1.1 connection with the spawner's token,
addressing the service directly (not through the proxy). After a warm-up, it reports grants/s
(= completed allocate+release pairs per second), requests/s, p50/p99 latency of each request
and of the pair, the CPU the clients, the service (event loop, other threads, and its store
process when decisions run there) and PostgreSQL used (so a client bottleneck would show), and at
the end counts double grants in the database: live slots held twice, and slots held twice at any
moment of the audit log replayed in commit order (must be 0).

Run ``python benchmarks/service_load.py`` (``--db sqlite,postgresql --clients 1,8,32 --seconds 10``
by default; ``--requests N`` measures N grants per run instead). PostgreSQL is reached at
``$GPUPOOL_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``, as for the tests);
a fresh database is created and dropped. ``--profile`` runs the service under cProfile and prints
where its time goes; ``--in-process`` runs the same allocate+release loop on ``Store`` directly
(no HTTP, no hub auth) to separate database cost from the rest. ``--decisions thread|process``
sets ``PoolService.decisions`` (default ``auto``: a store process on PostgreSQL, a thread on
SQLite) to compare the two.
"""

from __future__ import annotations

import argparse
import cProfile
import http.client
import io
import json
import multiprocessing as mp
import os
import platform
import pstats
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_JSON = HERE / "results" / "service_load.json"
PG_ADMIN_URL = os.environ.get("GPUPOOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

TARGET_GRANTS_PER_S = 300.0  # at 32 clients on PostgreSQL (issue)
TARGET_P99_MS = 50.0
NODES, GPUS_PER_NODE = 64, 8
OFFER = "h100"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def pool_yaml(nodes: int = NODES, gpus: int = GPUS_PER_NODE) -> str:
    """A pool where grants never queue: ``nodes`` x ``gpus`` whole H100s, no quota limits."""
    lines = ["nodes:"]
    for n in range(nodes):
        lines += [
            f"  - name: bench-{n:03d}",
            "    cpu_milli: 1000000",
            "    memory_mib: 100000000",
            f"    gpus: [{{model: H100-80GB, count: {gpus}}}]",
        ]
    lines += ["offers:", f"  - {{name: {OFFER}, kind: gpu, count: 1, models: [H100-80GB]}}"]
    return "\n".join(lines) + "\n"


# -- clients (stdlib only: the spawned processes import nothing heavy) ---------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``, or None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


def client(
    wid: int,
    api: str,
    token: str,
    start_at: float,
    warmup: float,
    seconds: float | None,
    pairs: int | None,
    out: Any,
) -> None:
    """Allocate + release in a loop over one keep-alive connection; report latencies and CPU."""
    u = urlsplit(api)
    prefix = u.path.rstrip("/")
    headers = {"Authorization": f"token {token}", "Content-Type": "application/json"}
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    post_ms: list[float] = []
    delete_ms: list[float] = []
    pair_ms: list[float] = []
    errors: Counter[str] = Counter()
    first = last = None
    cpu0 = None
    measured = 0
    i = 0

    def call(method: str, path: str, body: bytes | None) -> tuple[int, Any]:
        conn.request(method, f"{prefix}/{path}", body=body, headers=headers)
        r = conn.getresponse()
        return r.status, json.loads(r.read() or b"null")

    while time.time() < start_at:
        time.sleep(min(0.01, max(0.0, start_at - time.time())))
    window = start_at + warmup
    while True:
        now = time.time()
        if seconds is not None and now >= window + seconds:
            break
        if pairs is not None and measured >= pairs:
            break
        measuring = now >= window
        if measuring and cpu0 is None:
            cpu0 = time.process_time()
        body = json.dumps({"user": f"bench{wid}", "server": f"s{i}", "offer": OFFER}).encode()
        i += 1
        t0 = time.perf_counter()
        status, lease = call("POST", "allocations", body)
        t1 = time.perf_counter()
        if status != 201 or lease.get("state") != "granted":
            errors[f"POST {status} {lease.get('state') if isinstance(lease, dict) else ''}"] += 1
            if status != 201:
                continue
        status2, _ = call("DELETE", f"allocations/{lease['id']}", None)
        t2 = time.perf_counter()
        if status2 != 200:
            errors[f"DELETE {status2}"] += 1
        if measuring:
            first = now if first is None else first
            last = time.time()
            measured += 1
            post_ms.append(1000 * (t1 - t0))
            delete_ms.append(1000 * (t2 - t1))
            pair_ms.append(1000 * (t2 - t0))
    out.put(
        {
            "wid": wid,
            "post_ms": post_ms,
            "delete_ms": delete_ms,
            "pair_ms": pair_ms,
            "errors": dict(errors),
            "first": first,
            "last": last,
            "cpu_s": time.process_time() - (cpu0 if cpu0 is not None else 0.0),
        }
    )


# -- CPU accounting ------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def children(pid: int) -> list[int]:
    """The child processes of ``pid`` (the service's store process, with decisions = process)."""
    out = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if int((p / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(p.name))
            except (OSError, IndexError, ValueError):
                continue
    return out


def thread_cpu(pid: int) -> tuple[float, float]:
    """CPU seconds so far of a process's main thread (the service's event loop) and of all its
    other threads together (the service's writer thread, executor threads)."""
    main = other = 0.0
    try:
        tids = [int(t.name) for t in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return 0.0, 0.0
    for tid in tids:
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        if tid == pid:
            main += cpu
        else:
            other += cpu
    return main, other


def postgres_cpu() -> dict[int, float]:
    """CPU seconds so far of every ``postgres`` process on this machine (other users' too)."""
    out = {}
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if (p / "comm").read_text().strip() == "postgres":
                    out[int(p.name)] = proc_cpu(int(p.name))
            except OSError:
                continue
    return out


def cpu_delta(before: dict[int, float], after: dict[int, float]) -> float:
    """CPU used between two ``postgres_cpu`` readings by the processes alive at the second."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in after.items())


def machine_busy() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + parts[4]
    return (sum(parts) - idle) / CLOCK_TICKS, sum(parts) / CLOCK_TICKS


# -- databases -----------------------------------------------------------------------------------


def create_pg_database() -> str:
    """A fresh, empty PostgreSQL database (like the tests' ``pg_url`` fixture)."""
    import psycopg

    name = f"gpupool_bench_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_ADMIN_URL.rsplit('/', 1)[0]}/{name}"


def drop_pg_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def plain_engine(url: str):
    """A SQLAlchemy engine for reading (no BEGIN IMMEDIATE: never in the service's way)."""
    from sqlalchemy import create_engine

    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url.removeprefix("postgresql://")
    return create_engine(url)


def double_grants(url: str) -> dict[str, int]:
    """Slots held twice: live right now, and at any moment of the replayed audit log."""
    from sqlalchemy import text

    engine = plain_engine(url)
    try:
        with engine.connect() as conn:
            live_twice = conn.scalar(
                text(
                    "SELECT count(*) FROM (SELECT slot_key FROM lease_slots "
                    "WHERE live AND kind != 'shared' GROUP BY slot_key HAVING count(*) > 1) d"
                )
            )
            keys: dict[str, list[str]] = {}
            for lease, key in conn.execute(text("SELECT lease_id, slot_key FROM lease_slots")):
                keys.setdefault(lease, []).append(key)
            events = conn.execute(
                text(
                    "SELECT kind, lease_id FROM events "
                    "WHERE kind IN ('granted', 'released') ORDER BY id"
                )
            ).all()
            left = conn.scalar(text("SELECT count(*) FROM leases WHERE state != 'released'"))
            queued = conn.scalar(text("SELECT count(*) FROM leases WHERE queued_since IS NOT NULL"))
            leases = conn.scalar(text("SELECT count(*) FROM leases"))
    finally:
        engine.dispose()
    holder: dict[str, str] = {}
    replayed = 0
    for kind, lease in events:
        for key in keys.get(lease, ()):
            if kind == "granted":
                if key in holder:
                    replayed += 1
                holder[key] = lease
            elif holder.get(key) == lease:
                del holder[key]
    return {
        "live_slots_held_twice": int(live_twice or 0),
        "audit_replay_double_grants": replayed,
        "leases": int(leases or 0),
        "leases_not_released": int(left or 0),
        "leases_ever_queued": int(queued or 0),
    }


# -- one database: hub + service, then each client count -----------------------------------------


def bench_env(workdir: Path, db_url: str, profile: Path | None, decisions: str = "auto"):
    """A HubEnv (from the integration tests) whose service optionally runs under cProfile."""
    sys.path.insert(0, str(ROOT))
    from tests.integration.hubenv import HubEnv

    pool = workdir / "bench-pool.yaml"
    pool.write_text(pool_yaml())
    python = (sys.executable,)
    if profile is not None:
        python = (sys.executable, "-m", "cProfile", "-o", str(profile))
    return HubEnv(
        workdir,
        db_url,
        pool,
        # the benchmark's users have no servers in the hub: do not reconcile them away
        service_args=(
            "--PoolService.reconcile_on_start=False",
            f"--PoolService.decisions={decisions}",
        ),
        python=python,
    )


def run_clients(env: Any, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """``n`` client processes against the running service; returns the figures."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    per_client = None if args.requests is None else max(1, args.requests // n)
    start_at = time.time() + 1.0 + 0.05 * n  # every process is up and waiting by then
    procs = [
        ctx.Process(
            target=client,
            args=(
                w,
                env.api,
                env.spawner_token,
                start_at,
                args.warmup,
                args.seconds if args.requests is None else None,
                per_client,
                out,
            ),
        )
        for w in range(n)
    ]
    for p in procs:
        p.start()
    while time.time() < start_at + args.warmup:
        time.sleep(0.005)
    threads0 = thread_cpu(env.service.pid)
    store_pids = children(env.service.pid)
    store0 = sum(proc_cpu(p) for p in store_pids)
    svc0, hub0, pg0, (busy0, tot0) = (
        proc_cpu(env.service.pid) + store0,
        proc_cpu(env.hub.pid),
        postgres_cpu(),
        machine_busy(),
    )
    t0 = time.time()
    results = [out.get(timeout=args.seconds * 20 + 600 if args.seconds else 3600) for _ in procs]
    wall = time.time() - t0
    threads1 = thread_cpu(env.service.pid)
    store1 = sum(proc_cpu(p) for p in store_pids)
    svc1, hub1, pg1, (busy1, tot1) = (
        proc_cpu(env.service.pid) + store1,
        proc_cpu(env.hub.pid),
        postgres_cpu(),
        machine_busy(),
    )
    for p in procs:
        p.join(30)
    firsts = [r["first"] for r in results if r["first"] is not None]
    lasts = [r["last"] for r in results if r["last"] is not None]
    span = (max(lasts) - min(firsts)) if firsts and lasts else 0.0
    post = [x for r in results for x in r["post_ms"]]
    delete = [x for r in results for x in r["delete_ms"]]
    pair = [x for r in results for x in r["pair_ms"]]
    errors: Counter[str] = Counter()
    for r in results:
        errors.update(r["errors"])
    client_cpu = sum(r["cpu_s"] for r in results)
    cores = (tot1 - tot0) / wall if wall else 0.0

    def pct(values: list[float]) -> dict[str, float | None]:
        return {
            "p50": _round(percentile(values, 50)),
            "p99": _round(percentile(values, 99)),
            "max": _round(max(values) if values else None),
        }

    return {
        "clients": n,
        "grants": len(pair),
        "seconds": round(span, 3),
        "grants_per_s": round(len(pair) / span, 1) if span else 0.0,
        "requests_per_s": round(2 * len(pair) / span, 1) if span else 0.0,
        "post_ms": pct(post),
        "delete_ms": pct(delete),
        "pair_ms": pct(pair),
        "errors": dict(errors),
        # CPU the service spends per grant (POST + DELETE): 1000 / this is its ceiling on one core
        "service_cpu_ms_per_grant": round(1000 * (svc1 - svc0) / len(pair), 2) if pair else None,
        "cpu_cores_used": {
            "clients": round(client_cpu / wall, 3) if wall else None,
            "service": round((svc1 - svc0) / wall, 3) if wall else None,
            "service_event_loop": round((threads1[0] - threads0[0]) / wall, 3) if wall else None,
            "service_other_threads": round((threads1[1] - threads0[1]) / wall, 3) if wall else None,
            "service_store_process": round((store1 - store0) / wall, 3) if wall else None,
            "hub": round((hub1 - hub0) / wall, 3) if wall else None,
            "postgres_all": round(cpu_delta(pg0, pg1) / wall, 3) if wall else None,
            "machine": round((busy1 - busy0) / wall, 3) if wall else None,
            "machine_cores": round(cores, 2),
        },
        "loadavg_after": os.getloadavg()[0],
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def bench_db(db: str, args: argparse.Namespace) -> dict[str, Any]:
    """Start hub + service on a fresh ``db`` database and run every client count."""
    with tempfile.TemporaryDirectory(prefix=f"gpupool-bench-{db}-") as tmp:
        workdir = Path(tmp)
        url = f"sqlite:///{workdir}/pool.sqlite" if db == "sqlite" else create_pg_database()
        profile = None
        if args.profile:
            profile = (args.profile_dir or workdir) / f"service-{db}.prof"
            profile.parent.mkdir(parents=True, exist_ok=True)
        runs: list[dict[str, Any]] = []
        try:
            env = bench_env(workdir, url, profile, args.decisions)
            try:
                env.start()
                for n in args.clients:
                    run = run_clients(env, n, args)
                    run["db"] = db
                    runs.append(run)
                    print_row(run)
            except BaseException:
                print(env.logs(), file=sys.stderr)
                raise
            finally:
                env.stop()
            checks = double_grants(url)
        finally:
            if db != "sqlite":
                drop_pg_database(url)
        prof = summarize_profile(profile) if profile is not None and profile.exists() else None
    return {"db": db, "runs": runs, "checks": checks, "profile": prof}


# -- profiles ------------------------------------------------------------------------------------

CATEGORIES = (
    ("database driver (psycopg / sqlite3: waiting on the database)", ("psycopg", "sqlite3")),
    ("SQLAlchemy (ORM, compilation, unit of work)", ("sqlalchemy",)),
    ("pool store + allocator", ("jupyterhub_gpupool/store", "jupyterhub_gpupool/pool")),
    ("pool service handlers", ("jupyterhub_gpupool/service",)),
    ("hub auth (jupyterhub.services.auth)", ("jupyterhub/",)),
    ("tornado (HTTP server, routing)", ("tornado",)),
    ("event loop / sockets (idle waits included)", ("asyncio", "selectors", "select.epoll")),
    ("logging", ("logging",)),
    ("json", ("json",)),
)


def categorize(filename: str, name: str) -> str:
    where = f"{filename}:{name}"
    for label, keys in CATEGORIES:
        if any(k in where for k in keys):
            return label
    return "other"


def summarize_profile(path: Path, top: int = 25) -> dict[str, Any]:
    """Self time by category, and the top functions by self and cumulative time."""
    stats = pstats.Stats(str(path))
    by_cat: Counter[str] = Counter()
    for (filename, _line, name), (_cc, _nc, tt, _ct, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        by_cat[categorize(filename, name)] += tt
    text = io.StringIO()
    stats.stream = text  # type: ignore[attr-defined]
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(r"jupyterhub_gpupool|auth\.py", top)
    return {
        "self_seconds_by_category": {k: round(v, 2) for k, v in by_cat.most_common()},
        "text": text.getvalue(),
    }


# -- in process: the same loop on Store directly --------------------------------------------------


def in_process(db: str, args: argparse.Namespace) -> dict[str, Any]:
    """What the service's handlers call for POST and DELETE (``allocate``; ``lease_owner`` +
    ``release``), on ``Store`` directly and sequentially: no HTTP, no hub auth. Reports wall and
    CPU time per pair (wall - CPU ~ waiting on the database) and the statements each sends."""
    from sqlalchemy import event

    from jupyterhub_gpupool.dbutil import make_engine, upgrade
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import load_pool_config
    from jupyterhub_gpupool.store import Store

    n = args.requests or 1000
    warm = 100
    with tempfile.TemporaryDirectory(prefix=f"gpupool-inproc-{db}-") as tmp:
        url = f"sqlite:///{tmp}/pool.sqlite" if db == "sqlite" else create_pg_database()
        try:
            upgrade(url)
            catalog = default_catalog()
            engine = make_engine(url)
            store = Store(engine, catalog)
            pool = Path(tmp) / "pool.yaml"
            pool.write_text(pool_yaml())
            store.load_config(load_pool_config(str(pool), catalog))
            sent: Counter[str] = Counter()
            phase = ["allocate"]

            @event.listens_for(engine, "before_cursor_execute")
            def _count(*_: Any) -> None:
                sent[phase[0]] += 1

            @event.listens_for(engine, "commit")
            def _commit(*_: Any) -> None:
                sent[phase[0] + " commits"] += 1

            alloc_ms, release_ms = [], []
            prof = cProfile.Profile() if args.profile else None
            cpu0 = wall0 = 0.0
            for i in range(n + warm):
                if i == warm:
                    sent.clear()
                    cpu0, wall0 = time.process_time(), time.perf_counter()
                    if prof is not None:
                        prof.enable()
                phase[0] = "allocate"
                t0 = time.perf_counter()
                lease = store.allocate(f"bench{i % 32}", f"s{i}", OFFER, actor="bench")
                t1 = time.perf_counter()
                phase[0] = "release"
                store.lease_owner(lease["id"])  # the DELETE handler's scope check
                store.release(lease["id"], actor="bench")
                t2 = time.perf_counter()
                if i >= warm:
                    alloc_ms.append(1000 * (t1 - t0))
                    release_ms.append(1000 * (t2 - t1))
            cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
            if prof is not None:
                prof.disable()
            engine.dispose()
        finally:
            if db != "sqlite":
                drop_pg_database(url)
        out: dict[str, Any] = {
            "db": db,
            "pairs": n,
            "pairs_per_s": round(n / wall, 1),
            "wall_ms_per_pair": round(1000 * wall / n, 2),
            "cpu_ms_per_pair": round(1000 * cpu / n, 2),
            "statements_per_allocate": round(sent["allocate"] / n, 1),
            "statements_per_release": round(sent["release"] / n, 1),
            "commits_per_pair": round((sent["allocate commits"] + sent["release commits"]) / n, 1),
            "allocate_ms": {
                "p50": _round(percentile(alloc_ms, 50)),
                "p99": _round(percentile(alloc_ms, 99)),
            },
            "release_ms": {
                "p50": _round(percentile(release_ms, 50)),
                "p99": _round(percentile(release_ms, 99)),
            },
        }
        if prof is not None:
            path = Path(tmp) / "inproc.prof"
            prof.dump_stats(str(path))
            out["profile"] = summarize_profile(path)
    return out


# -- output --------------------------------------------------------------------------------------

HEADER = (
    f"{'db':<11}{'clients':>8}{'grants/s':>10}{'req/s':>8}{'POST p50':>10}{'p99':>8}"
    f"{'DELETE p50':>12}{'p99':>8}{'pair p99':>10}{'errors':>8}"
    f"{'cpu: svc':>10}{'loop':>6}{'other':>6}{'store':>6}{'pg':>6}{'clients':>9}{'box':>6}"
    f"{'svc ms/grant':>14}"
)


def print_row(run: dict[str, Any]) -> None:
    cpu = run["cpu_cores_used"]
    print(
        f"{run['db']:<11}{run['clients']:>8}{run['grants_per_s']:>10.1f}"
        f"{run['requests_per_s']:>8.0f}{run['post_ms']['p50']:>10.1f}{run['post_ms']['p99']:>8.1f}"
        f"{run['delete_ms']['p50']:>12.1f}{run['delete_ms']['p99']:>8.1f}"
        f"{run['pair_ms']['p99']:>10.1f}{sum(run['errors'].values()):>8}"
        f"{cpu['service']:>10.2f}{cpu['service_event_loop']:>6.2f}"
        f"{cpu['service_other_threads']:>6.2f}{cpu['service_store_process']:>6.2f}"
        f"{cpu['postgres_all']:>6.2f}{cpu['clients']:>9.2f}"
        f"{cpu['machine']:>6.2f}{run['service_cpu_ms_per_grant'] or 0:>14.2f}",
        flush=True,
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="sqlite,postgresql", help="sqlite and/or postgresql")
    ap.add_argument("--clients", default="1,8,32", help="concurrent clients, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--requests", type=int, help="measure this many grants per run instead")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    ap.add_argument("--json", type=Path, default=DEFAULT_JSON, help="where to save the figures")
    ap.add_argument("--profile", action="store_true", help="run the service under cProfile")
    ap.add_argument(
        "--decisions",
        default="auto",
        choices=("auto", "thread", "process"),
        help="PoolService.decisions: where allocate/release run (auto: process on PostgreSQL)",
    )
    ap.add_argument(
        "--profile-dir", type=Path, help="keep the cProfile files here (default: thrown away)"
    )
    ap.add_argument(
        "--in-process",
        action="store_true",
        help="also time allocate+release on Store directly (no HTTP, no auth)",
    )
    args = ap.parse_args(argv)
    args.db = [d.strip() for d in args.db.split(",") if d.strip()]
    bad = [d for d in args.db if d not in ("sqlite", "postgresql")]
    if bad:
        ap.error(f"unknown database {bad[0]!r} (sqlite, postgresql)")
    args.clients = [int(c) for c in args.clients.split(",")]

    amount = f"{args.requests} grants" if args.requests else f"{args.seconds:g}s"
    print(
        f"pool: {NODES} nodes x {GPUS_PER_NODE} H100 = {NODES * GPUS_PER_NODE} GPUs; "
        f"{amount} per run "
        f"after {args.warmup:g}s warm-up; load average now {os.getloadavg()[0]:.1f}"
    )
    print(HEADER)
    report: dict[str, Any] = {
        "benchmark": "service_load",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
        },
        "args": {
            "db": args.db,
            "clients": args.clients,
            "seconds": None if args.requests else args.seconds,
            "requests": args.requests,
            "warmup": args.warmup,
            "pool_gpus": NODES * GPUS_PER_NODE,
        },
        "databases": [],
    }
    failed = False
    for db in args.db:
        result = bench_db(db, args)
        report["databases"].append(result)
        checks = result["checks"]
        doubles = checks["live_slots_held_twice"] + checks["audit_replay_double_grants"]
        print(
            f"{db}: double grants {doubles} (live {checks['live_slots_held_twice']}, audit "
            f"replay {checks['audit_replay_double_grants']}); {checks['leases']} leases, "
            f"{checks['leases_not_released']} not released, {checks['leases_ever_queued']} queued"
        )
        failed |= doubles > 0 or checks["leases_not_released"] > 0
        if result["profile"]:
            print(f"\n--- service profile ({db}): self time by category")
            for k, v in result["profile"]["self_seconds_by_category"].items():
                print(f"  {v:8.2f}s  {k}")
            print(result["profile"]["text"])
    if args.in_process:
        report["in_process"] = []
        for db in args.db:
            r = in_process(db, args)
            report["in_process"].append(r)
            print(
                f"in-process Store ({db}): {r['pairs_per_s']} allocate+release/s; per pair "
                f"{r['wall_ms_per_pair']} ms wall, {r['cpu_ms_per_pair']} ms CPU; "
                f"{r['statements_per_allocate']} statements per allocate, "
                f"{r['statements_per_release']} per release (with the owner check), "
                f"{r['commits_per_pair']} commits; allocate p50 {r['allocate_ms']['p50']} ms "
                f"p99 {r['allocate_ms']['p99']} ms, release p50 {r['release_ms']['p50']} ms "
                f"p99 {r['release_ms']['p99']} ms"
            )
            if "profile" in r:
                for k, v in r["profile"]["self_seconds_by_category"].items():
                    print(f"  {v:8.2f}s  {k}")
                print(r["profile"]["text"])
    target = None
    for result in report["databases"]:
        for run in result["runs"]:
            if run["db"] == "postgresql" and run["clients"] == 32:
                target = {
                    "grants_per_s": run["grants_per_s"],
                    "p99_ms": max(run["post_ms"]["p99"] or 0, run["delete_ms"]["p99"] or 0),
                }
    if target is not None:
        target["met"] = (
            target["grants_per_s"] >= TARGET_GRANTS_PER_S and target["p99_ms"] <= TARGET_P99_MS
        )
        print(
            f"target (PostgreSQL, 32 clients): >= {TARGET_GRANTS_PER_S:g} grants/s with p99 <= "
            f"{TARGET_P99_MS:g} ms -> {target['grants_per_s']} grants/s, p99 "
            f"{target['p99_ms']} ms: {'met' if target['met'] else 'NOT met'}"
        )
    report["target"] = target
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

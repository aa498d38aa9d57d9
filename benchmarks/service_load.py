"""Service load benchmark: allocate + release through the real pool service on loopback.

Issue 16's target: >= 800 grants/s with a request p99 <= 40 ms at 32 concurrent clients on
PostgreSQL, as the median of 5 runs, beside the raw limit measured in the same run.

For each database (SQLite file, fresh PostgreSQL database) the benchmark starts a real JupyterHub
(with configurable-http-proxy) and the pool service as an external hub service, exactly as the
integration tests do (``tests/integration/hubenv.py``), with a pool big enough that nothing ever
queues (64 nodes x 8 whole H100s = 512 GPUs), so what it measures is grants. Then, for each client
count, that many client *processes* each loop ``POST allocations`` (a grant) -> ``DELETE
allocations/{id}`` (its release) over one keep-alive HTTP/1.1 connection with the spawner's token,
addressing the service directly (not through the proxy); ``loadclient.py`` is their HTTP client
(``--client raw``, a minimal one as ``wrk`` is, or ``stdlib``: ``http.client``). After a warm-up,
it reports grants/s (= completed allocate+release pairs per second), requests/s, p50/p99 latency of
each request and of the pair, the CPU the clients, the service (event loop, other threads, and its
store process when decisions run there) and PostgreSQL used (so a client bottleneck would show),
and at the end counts double grants in the database: live slots held twice, and slots held twice at
any moment of the audit log replayed in commit order (must be 0).

Run ``python benchmarks/service_load.py`` (``--db sqlite,postgresql --clients 1,8,32 --seconds 10``
by default; ``--requests N`` measures N grants per run instead). PostgreSQL is reached at
``$GPUPOOL_TEST_PG`` (default ``postgresql://postgres@127.0.0.1:5432/test``, as for the tests);
a fresh database is created and dropped. ``--profile`` runs the service under cProfile and prints
where its time goes; ``--in-process`` runs the same allocate+release loop on ``Store`` directly
(no HTTP, no hub auth) to separate database cost from the rest. ``--decisions thread|process``
sets ``PoolService.decisions`` (default ``auto``: a store process on PostgreSQL, a thread on
SQLite) to compare the two.

``--runs N`` repeats every measurement N times and prints one table per run, then the median and
spread. ``--compare-tree DIR`` also starts a hub + service whose pool package comes from another
checkout (``PYTHONPATH``; e.g. ``git worktree add /tmp/base-tree HEAD``), each on its own fresh
database, and alternates the two in every run, so before and after see the same machine load.
``--replicas N`` starts N pool services on the one database (the extra ones on their own ports,
with the same hub credentials) and splits the clients between them; the double-grant check covers
them all. On PostgreSQL each run ends with the raw limit (``service_raw.py``, ``--no-raw-limit``
skips it): the same rows written by minimal SQL on a fresh database, and the service's grants/s
as a fraction of it. The CPU columns add ms per grant of the service, its store process(es) and
PostgreSQL; the batch columns (from the service's ``gpupool_write_batch_*`` metrics) the mean
calls per writer batch, its milliseconds, and the share of the window the writer was busy.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from loadclient import CLIENTS, OFFER, client
from prometheus_client.parser import text_string_to_metric_families
from service_raw import raw_limit
from service_summary import print_raw, print_summary, summarize

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
DEFAULT_JSON = HERE / "results" / "service_load.json"
PG_ADMIN_URL = os.environ.get("GPUPOOL_TEST_PG", "postgresql://postgres@127.0.0.1:5432/test")

TARGET_GRANTS_PER_S = 800.0  # at 32 clients on PostgreSQL, median of 5 runs (issue 16)
TARGET_P99_MS = 40.0
NODES, GPUS_PER_NODE = 64, 8
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


# -- figures -------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (nearest rank) of ``values``, or None when empty."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * len(s) + 0.5) - 1))]


# -- CPU accounting ------------------------------------------------------------------------------


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def batch_stats(apis: list[str]) -> tuple[float, ...] | None:
    """Calls, batches and seconds the services' writers have applied so far, from their
    ``/metrics`` (``gpupool_write_batch_*``); None where a tree has no such metrics."""
    names = tuple(f"gpupool_write_batch_{x}" for x in ("calls_sum", "calls_count", "seconds_sum"))
    total = [0.0, 0.0, 0.0]
    for api in apis:
        try:
            with urllib.request.urlopen(api.replace("/api/v1", "/metrics"), timeout=30) as r:
                text = r.read().decode()
        except OSError:
            return None
        found = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        if not all(n in found for n in names):
            return None
        total = [t + found[n] for t, n in zip(total, names, strict=True)]
    return tuple(total)


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


# -- one database: hub + service(s), then each client count --------------------------------------


def bench_env(
    workdir: Path,
    db_url: str,
    profile: Path | None,
    decisions: str = "auto",
    tree: Path | None = None,
):
    """A HubEnv (from the integration tests) whose service optionally runs under cProfile, and
    with ``tree``, imports the pool package from that checkout (``PYTHONPATH``) instead."""
    sys.path.insert(0, str(ROOT))
    from tests.integration.hubenv import HubEnv

    class BenchEnv(HubEnv):
        def service_env(self) -> dict[str, str]:
            env = super().service_env()
            if tree is not None:  # the service and its store process run the other checkout
                env["PYTHONPATH"] = os.pathsep.join(
                    [str(tree), *filter(None, [env.get("PYTHONPATH")])]
                )
            return env

    pool = workdir / "bench-pool.yaml"
    pool.write_text(pool_yaml())
    python = (sys.executable,)
    if profile is not None:
        python = (sys.executable, "-m", "cProfile", "-o", str(profile))
    return BenchEnv(
        workdir,
        db_url,
        pool,
        # the benchmark's users have no servers in the hub: do not reconcile them away
        service_args=(
            "--PoolService.reconcile_on_start=False",
            f"--PoolService.decisions={decisions}",
            "--PoolService.authenticate_prometheus=False",  # the writer's batch figures
        ),
        python=python,
    )


class Deployment:
    """A hub, its pool service and ``replicas - 1`` more pool services on the same database
    (each on its own port, with the same hub credentials: clients address them directly)."""

    def __init__(self, env: Any, replicas: int) -> None:
        self.env = env
        self.replicas = replicas
        self.extra: list[subprocess.Popen] = []
        self.apis: list[str] = []

    def start(self) -> None:
        from tests.integration.hubenv import free_port, wait_http

        env = self.env
        env.start()
        self.apis = [env.api]
        for _ in range(self.replicas - 1):
            port = free_port()
            args = [sys.executable, "-m", "jupyterhub_gpupool.cli", "service"]
            args += [f"--db-url={env.db_url}", f"--pool-config={env.pool_config}"]
            args += [*env.service_args, f"--PoolService.port={port}"]
            log = open(env.dir / f"service-{port}.log", "ab")  # noqa: SIM115
            proc = subprocess.Popen(
                args,
                cwd=env.dir,
                env=env.service_env(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            self.extra.append(proc)
            api = f"http://127.0.0.1:{port}{env.service_prefix}api/v1"
            wait_http(f"{api}/pool", 60, proc)
            self.apis.append(api)

    @property
    def service_pids(self) -> list[int]:
        return [self.env.service.pid, *(p.pid for p in self.extra)]

    def stop(self) -> None:
        for proc in self.extra:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
        self.env.stop()


def run_clients(dep: Deployment, n: int, args: argparse.Namespace) -> dict[str, Any]:
    """``n`` client processes against the running service(s), split evenly between the
    replicas; returns the figures."""
    env = dep.env
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    per_client = None if args.requests is None else max(1, args.requests // n)
    start_at = time.time() + 1.0 + 0.05 * n  # every process is up and waiting by then
    procs = [
        ctx.Process(
            target=client,
            args=(
                w,
                dep.apis[w % len(dep.apis)],
                env.spawner_token,
                start_at,
                args.warmup,
                args.seconds if args.requests is None else None,
                per_client,
                out,
                args.client,
            ),
        )
        for w in range(n)
    ]
    for p in procs:
        p.start()
    while time.time() < start_at + args.warmup:
        time.sleep(0.005)
    pids = dep.service_pids
    store_pids = [c for pid in pids for c in children(pid)]

    def sample() -> tuple:
        threads = [thread_cpu(pid) for pid in pids]
        store = sum(proc_cpu(p) for p in store_pids)
        return (
            sum(t[0] for t in threads),
            sum(t[1] for t in threads),
            store,
            sum(proc_cpu(pid) for pid in pids) + store,
            proc_cpu(env.hub.pid),
            postgres_cpu(),
            machine_busy(),
        )

    batches0 = batch_stats(dep.apis)
    loop0, other0, store0, svc0, hub0, pg0, (busy0, tot0) = sample()
    t0 = time.time()
    results = [out.get(timeout=args.seconds * 20 + 600 if args.seconds else 3600) for _ in procs]
    wall = time.time() - t0
    loop1, other1, store1, svc1, hub1, pg1, (busy1, tot1) = sample()
    batches1 = batch_stats(dep.apis)
    writer = None
    if batches0 is not None and batches1 is not None and batches1[1] > batches0[1]:
        n_batches = batches1[1] - batches0[1]
        writer = {  # from the measured window's start to the last client's end
            "batches": int(n_batches),
            "calls_per_batch": round((batches1[0] - batches0[0]) / n_batches, 1),
            "ms_per_batch": round(1000 * (batches1[2] - batches0[2]) / n_batches, 2),
            "busy_share": round((batches1[2] - batches0[2]) / wall / len(dep.apis), 3)
            if wall
            else None,
        }
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
        "store_cpu_ms_per_grant": round(1000 * (store1 - store0) / len(pair), 2) if pair else None,
        "postgres_cpu_ms_per_grant": round(1000 * cpu_delta(pg0, pg1) / len(pair), 2)
        if pair
        else None,
        "cpu_cores_used": {
            "clients": round(client_cpu / wall, 3) if wall else None,
            "service": round((svc1 - svc0) / wall, 3) if wall else None,
            "service_event_loop": round((loop1 - loop0) / wall, 3) if wall else None,
            "service_other_threads": round((other1 - other0) / wall, 3) if wall else None,
            "service_store_process": round((store1 - store0) / wall, 3) if wall else None,
            "hub": round((hub1 - hub0) / wall, 3) if wall else None,
            "postgres_all": round(cpu_delta(pg0, pg1) / wall, 3) if wall else None,
            "machine": round((busy1 - busy0) / wall, 3) if wall else None,
            "machine_cores": round(cores, 2),
        },
        "writer": writer,
        "loadavg_after": os.getloadavg()[0],
    }


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def bench_db(db: str, trees: dict[str, Path | None], args: argparse.Namespace) -> dict[str, Any]:
    """Start hub + service(s) for each tree on its own fresh ``db`` database, then ``--runs``
    rounds: in each, every tree and client count (trees alternating, so both see the same
    machine load), and on PostgreSQL the raw limit measured right after. One table per run."""
    with contextlib.ExitStack() as stack:
        deps: dict[str, Deployment] = {}
        urls: dict[str, str] = {}
        profiles: dict[str, Path] = {}
        runs: list[dict[str, Any]] = []
        raws: list[dict[str, Any]] = []
        for label, tree in trees.items():
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=f"gpb-{db}-")))
            url = f"sqlite:///{workdir}/pool.sqlite" if db == "sqlite" else create_pg_database()
            urls[label] = url
            if db != "sqlite":
                stack.callback(drop_pg_database, url)
            profile = None
            if args.profile:
                profile = (args.profile_dir or workdir) / f"service-{db}-{label}.prof"
                profile.parent.mkdir(parents=True, exist_ok=True)
                profiles[label] = profile
            dep = Deployment(bench_env(workdir, url, profile, args.decisions, tree), args.replicas)
            stack.callback(dep.stop)
            try:
                dep.start()
            except BaseException:
                print(dep.env.logs(), file=sys.stderr)
                raise
            deps[label] = dep
        for r in range(args.runs):
            print(f"\n--- {db}, run {r + 1}/{args.runs}: {loadavg()}", flush=True)
            print(HEADER)
            for label, dep in deps.items():
                for n in args.clients:
                    try:
                        run = run_clients(dep, n, args)
                    except BaseException:
                        print(dep.env.logs(), file=sys.stderr)
                        raise
                    run.update(db=db, tree=label, run=r, replicas=args.replicas)
                    runs.append(run)
                    print_row(run)
            if db == "postgresql" and args.raw_limit:
                raw = raw_limit(
                    create_pg_database, drop_pg_database, max(args.clients), args.seconds, 1.0
                )
                raw["run"] = r
                raws.append(raw)
                print_raw(raw, [x for x in runs if x["run"] == r], max(args.clients))
        for dep in deps.values():
            dep.stop()
        checks = {label: double_grants(url) for label, url in urls.items()}
        prof = None
        if profiles:
            from service_inproc import summarize_profile

            prof = {k: summarize_profile(v) for k, v in profiles.items() if v.exists()}
    return {"db": db, "runs": runs, "raw_limit": raws, "checks": checks, "profile": prof}


def loadavg() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} on {os.cpu_count()} CPUs"


# -- output --------------------------------------------------------------------------------------

HEADER = (
    f"{'tree':<6}{'db':<11}{'clients':>8}{'grants/s':>10}{'req/s':>8}{'POST p50':>10}{'p99':>8}"
    f"{'DELETE p50':>12}{'p99':>8}{'pair p99':>10}{'errors':>8}"
    f"{'cpu: svc':>10}{'loop':>6}{'other':>6}{'store':>6}{'pg':>6}{'clients':>9}{'box':>6}"
    f"{'ms/grant: svc':>15}{'store':>7}{'pg':>6}{'batch: calls':>14}{'ms':>7}{'busy':>6}"
)


def print_row(run: dict[str, Any]) -> None:
    cpu = run["cpu_cores_used"]
    print(
        f"{run['tree']:<6}{run['db']:<11}{run['clients']:>8}{run['grants_per_s']:>10.1f}"
        f"{run['requests_per_s']:>8.0f}{run['post_ms']['p50']:>10.1f}{run['post_ms']['p99']:>8.1f}"
        f"{run['delete_ms']['p50']:>12.1f}{run['delete_ms']['p99']:>8.1f}"
        f"{run['pair_ms']['p99']:>10.1f}{sum(run['errors'].values()):>8}"
        f"{cpu['service']:>10.2f}{cpu['service_event_loop']:>6.2f}"
        f"{cpu['service_other_threads']:>6.2f}{cpu['service_store_process']:>6.2f}"
        f"{cpu['postgres_all']:>6.2f}{cpu['clients']:>9.2f}"
        f"{cpu['machine']:>6.2f}{run['service_cpu_ms_per_grant'] or 0:>15.2f}"
        f"{run['store_cpu_ms_per_grant'] or 0:>7.2f}{run['postgres_cpu_ms_per_grant'] or 0:>6.2f}"
        + (
            f"{w['calls_per_batch']:>14.1f}{w['ms_per_batch']:>7.1f}{w['busy_share']:>6.2f}"
            if (w := run.get("writer"))
            else f"{'-':>14}{'-':>7}{'-':>6}"
        ),
        flush=True,
    )


def tree_info(tree: Path) -> dict[str, Any]:
    """Which commit a checkout is at, and whether it has uncommitted changes."""

    def git(*a: str) -> str:
        return subprocess.run(
            ["git", "-C", str(tree), *a], capture_output=True, text=True, check=False
        ).stdout.strip()

    return {
        "path": str(tree),
        "commit": git("rev-parse", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", default="sqlite,postgresql", help="sqlite and/or postgresql")
    ap.add_argument("--clients", default="1,8,32", help="concurrent clients, comma-separated")
    ap.add_argument("--seconds", type=float, default=10.0, help="measured seconds per run")
    ap.add_argument("--requests", type=int, help="measure this many grants per run instead")
    ap.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds first")
    ap.add_argument("--runs", type=int, default=1, help="rounds; the summary is their median")
    ap.add_argument(
        "--replicas", type=int, default=1, help="pool services on the one database (clients split)"
    )
    ap.add_argument(
        "--compare-tree",
        type=Path,
        help="also run the service from this checkout (PYTHONPATH), alternating with this one",
    )
    ap.add_argument(
        "--no-raw-limit",
        dest="raw_limit",
        action="store_false",
        help="skip the minimal-SQL raw limit after each PostgreSQL run",
    )
    ap.add_argument(
        "--client",
        default="raw",
        choices=sorted(CLIENTS),
        help="the clients' HTTP: raw (a minimal keep-alive client, as wrk) or stdlib (http.client)",
    )
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
    trees: dict[str, Path | None] = {"new": None}
    if args.compare_tree is not None:
        other = args.compare_tree.resolve()
        if not (other / "jupyterhub_gpupool" / "__init__.py").exists():
            ap.error(f"--compare-tree: {other} has no jupyterhub_gpupool package")
        trees = {"base": other, "new": None}

    amount = f"{args.requests} grants" if args.requests else f"{args.seconds:g}s"
    print(
        f"pool: {NODES} nodes x {GPUS_PER_NODE} H100 = {NODES * GPUS_PER_NODE} GPUs; "
        f"{amount} per run after {args.warmup:g}s warm-up; {args.runs} run(s); "
        f"{args.replicas} service replica(s); trees: "
        + ", ".join(f"{k}={v or ROOT}" for k, v in trees.items())
        + f"; {loadavg()}"
    )
    report: dict[str, Any] = {
        "benchmark": "service_load",
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "loadavg_start": os.getloadavg(),
        },
        "args": {
            "db": args.db,
            "clients": args.clients,
            "seconds": None if args.requests else args.seconds,
            "requests": args.requests,
            "warmup": args.warmup,
            "runs": args.runs,
            "replicas": args.replicas,
            "decisions": args.decisions,
            "pool_gpus": NODES * GPUS_PER_NODE,
        },
        "trees": {k: tree_info(v or ROOT) for k, v in trees.items()},
        "databases": [],
        "summary": [],
    }
    failed = False
    for db in args.db:
        result = bench_db(db, trees, args)
        report["databases"].append(result)
        for label, checks in result["checks"].items():
            doubles = checks["live_slots_held_twice"] + checks["audit_replay_double_grants"]
            print(
                f"{db} [{label}]: double grants {doubles} (live {checks['live_slots_held_twice']}, "
                f"audit replay {checks['audit_replay_double_grants']}) over {args.replicas} "
                f"replica(s); {checks['leases']} leases, {checks['leases_not_released']} not "
                f"released, {checks['leases_ever_queued']} queued"
            )
            failed |= doubles > 0 or checks["leases_not_released"] > 0
        for label, prof in (result["profile"] or {}).items():
            print(f"\n--- service profile ({db}, {label}): self time by category")
            for k, v in prof["self_seconds_by_category"].items():
                print(f"  {v:8.2f}s  {k}")
            print(prof["text"])
        report["summary"] += summarize(result)
    print_summary(report["summary"], args.runs)
    if args.in_process:
        from service_inproc import print_in_process

        report["in_process"] = print_in_process(args)
    target = None
    for row in report["summary"]:
        if (row["db"], row["tree"], row["clients"]) == ("postgresql", "new", 32):
            target = {
                "grants_per_s": row["grants_per_s"]["median"],
                "p99_ms": row["request_p99_ms"]["median"],
                "replicas": args.replicas,
                "runs": args.runs,
            }
    if target is not None:
        target["met"] = (
            target["grants_per_s"] >= TARGET_GRANTS_PER_S and target["p99_ms"] <= TARGET_P99_MS
        )
        print(
            f"target (PostgreSQL, 32 clients, median of {args.runs}): >= "
            f"{TARGET_GRANTS_PER_S:g} grants/s with p99 <= {TARGET_P99_MS:g} ms -> "
            f"{target['grants_per_s']} grants/s, p99 {target['p99_ms']} ms: "
            f"{'met' if target['met'] else 'NOT met'}; {loadavg()}"
        )
    report["target"] = target
    report["machine"]["loadavg_end"] = os.getloadavg()
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"saved {args.json}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers of ``service_load.py``: the service's profile summary, and ``--in-process`` (the
allocate + release loop on ``Store`` directly, no HTTP and no hub auth), which separates the
database and ORM cost from the rest."""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from service_load import OFFER, _round, create_pg_database, drop_pg_database, percentile, pool_yaml

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
    """What the service's handlers call for POST and DELETE (``allocate``; ``lease_holder`` +
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
                store.lease_holder(lease.id)  # the DELETE handler's scope check
                store.release(lease.id, actor="bench")
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


def print_in_process(args: argparse.Namespace) -> list[dict[str, Any]]:
    """``--in-process`` for every database: run, print, return the figures."""
    out = []
    for db in args.db:
        r = in_process(db, args)
        out.append(r)
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
    return out

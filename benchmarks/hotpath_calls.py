"""The allocate/release hot path, counted: Python calls, SQL statements and CPU per pair.

What the service's handlers call for POST and DELETE (``Store.allocate``; ``lease_holder`` +
``release``), on ``Store`` directly over a SQLite file (no HTTP, no hub auth), in a pool where
nothing ever queues (``service_load.pool_yaml``). For each tree given (``--tree DIR``, repeated;
default: this checkout) a worker process imports that tree's package (``PYTHONPATH``) and
reports, after a warm-up:

- Python calls per pair under cProfile (deterministic: the same on a busy machine), in all and
  by where the function lives (``pool/``, ``store/``, SQLAlchemy, the rest);
- SQL statements per pair (an engine ``before_cursor_execute`` listener) and commits per pair;
- process CPU per pair with the profiler off (``time.process_time``), which a shared machine
  makes noisy: the runs alternate the trees (``--runs N``), so each sees the same load, and the
  summary gives the median and range.

``--batch N`` runs the pairs as the service's writer does instead: batches (``Store.run_batch``) of
the previous batch's N releases and N new asks, the figures then per batch.

``python benchmarks/hotpath_calls.py --tree /tmp/base-tree --tree . --runs 5``
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from service_load import OFFER, pool_yaml  # the pool where nothing ever queues

HERE = Path(__file__).resolve().parent


def _where(filename: str) -> str:
    f = filename.replace(os.sep, "/")
    if "jupyterhub_gpupool/pool/" in f:
        return "pool"
    if "jupyterhub_gpupool/store/" in f:
        return "store"
    if "jupyterhub_gpupool/" in f:
        return "package other"
    if "sqlalchemy" in f:
        return "sqlalchemy"
    return "other"


def _batched(store: Any, size: int) -> Callable[[], None]:
    """One writer batch as the service's (``Store.run_batch``): the releases of the previous
    batch's grants, then ``size`` asks (the figures are per batch; divide by ``size``)."""
    try:
        from jupyterhub_gpupool.pool import commands
    except ImportError:  # a tree before the typed commands: (method, args, kwargs)
        commands = None
    live: list[str] = []
    n = 0

    def one() -> None:
        nonlocal live, n
        calls: list[Any] = []
        for lid in live:
            calls.append(commands.Release(lid) if commands else (store.release, (lid,), {}))
        for _ in range(size):
            user, server = f"bench{n % 32}", f"s{n}"
            n += 1
            ask = (store.allocate, (user, server, OFFER), {})
            calls.append(commands.Allocate(user, server, OFFER) if commands else ask)
        out = store.run_batch(calls)[len(live) :]
        live = [x["id"] if isinstance(x, dict) else x.id for x in out]

    return one


def worker(pairs: int, warm: int, batch: int = 0) -> dict[str, Any]:
    """One tree's figures (runs in the tree's process); ``batch``: per batch of that many
    grants and releases (``_batched``) instead of per pair on their own."""
    from sqlalchemy import event

    import jupyterhub_gpupool
    from jupyterhub_gpupool.dbutil import make_engine, upgrade
    from jupyterhub_gpupool.pool.catalog import default_catalog
    from jupyterhub_gpupool.poolconfig import load_pool_config
    from jupyterhub_gpupool.store import Store

    with tempfile.TemporaryDirectory(prefix="gpupool-hotpath-") as tmp:
        url = f"sqlite:///{tmp}/pool.sqlite"
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
            sent["commits"] += 1

        i = 0

        def pair() -> None:
            nonlocal i
            phase[0] = "allocate"
            lease = store.allocate(f"bench{i % 32}", f"s{i}", OFFER, actor="bench")
            lid = lease["id"] if isinstance(lease, dict) else lease.id  # older trees: a dict
            phase[0] = "release"
            store.lease_holder(lid)  # the DELETE handler's scope check
            store.release(lid, actor="bench")
            i += 1

        if batch:
            pair = _batched(store, batch)
        for _ in range(warm):
            pair()
        # CPU, profiler off
        sent.clear()
        cpu0 = time.process_time()
        for _ in range(pairs):
            pair()
        cpu = time.process_time() - cpu0
        statements = dict(sent)
        # calls, under the profiler
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(pairs):
            pair()
        prof.disable()
        engine.dispose()
    stats = pstats.Stats(prof)
    calls: Counter[str] = Counter()
    funcs: Counter[str] = Counter()
    for (filename, line, name), (_cc, nc, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        calls[_where(filename)] += nc
        calls["all"] += nc
        if "jupyterhub_gpupool" in filename:
            short = filename.split("jupyterhub_gpupool/")[-1]
            funcs[f"{short}:{line}:{name}"] += nc
    return {
        "package": str(Path(jupyterhub_gpupool.__file__).parent.parent),
        "pairs": pairs,
        "cpu_ms_per_pair": 1000 * cpu / pairs,
        "calls_per_pair": {k: round(v / pairs, 1) for k, v in calls.items()},
        "statements_per_pair": {k: round(v / pairs, 2) for k, v in statements.items()},
        "top_package_functions": {k: round(v / pairs, 1) for k, v in funcs.most_common(40)},
    }


def spawn(tree: Path, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--worker",
            "--pairs",
            str(args.pairs),
            "--warm",
            str(args.warm),
            "--batch",
            str(args.batch),
        ],
        env=env,
        cwd=tree,
        capture_output=True,
        text=True,
    )
    if out.returncode:
        raise SystemExit(f"{tree}: the worker failed\n{out.stderr}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    if Path(result["package"]).resolve() != tree.resolve():
        raise SystemExit(f"{tree}: the worker imported {result['package']}")
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--tree", action="append", type=Path, help="a checkout (repeatable)")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=300)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument(
        "--batch",
        type=int,
        default=0,
        help="N: writer batches of N grants and N releases (Store.run_batch), as the service "
        "runs them; the figures are then per batch, so divide by N (--pairs counts batches)",
    )
    ap.add_argument("--top", action="store_true", help="print each tree's most called functions")
    ap.add_argument("--json", type=Path, help="write every run's figures here")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(worker(args.pairs, args.warm, args.batch)))
        return 0
    trees = [t.resolve() for t in (args.tree or [HERE.parent])]
    runs: dict[Path, list[dict[str, Any]]] = {t: [] for t in trees}
    for r in range(args.runs):
        order = trees if r % 2 == 0 else trees[::-1]  # alternate who goes first
        for t in order:
            res = spawn(t, args)
            runs[t].append(res)
            print(
                f"run {r + 1} {t}: {res['cpu_ms_per_pair']:.2f} ms CPU/pair, "
                f"{res['calls_per_pair']['all']} calls/pair",
                flush=True,
            )
    print()
    for t in trees:
        rs = runs[t]
        cpu = sorted(x["cpu_ms_per_pair"] for x in rs)
        last = rs[-1]
        print(f"{t}" + (f" (per batch of {args.batch} grants and releases)" if args.batch else ""))
        print(
            f"  CPU per pair: median {statistics.median(cpu):.2f} ms "
            f"(range {cpu[0]:.2f}-{cpu[-1]:.2f}, {len(cpu)} runs)"
        )
        spread = {x["calls_per_pair"]["all"] for x in rs}
        print(f"  calls per pair: {last['calls_per_pair']} (all runs: {sorted(spread)})")
        print(f"  SQL per pair: {last['statements_per_pair']}")
        if args.top:
            for k, v in last["top_package_functions"].items():
                print(f"    {v:8.1f}  {k}")
    if args.json:
        args.json.write_text(json.dumps({str(t): rs for t, rs in runs.items()}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

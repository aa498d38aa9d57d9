"""Mixed-pool benchmark: notebooks, training and inference on one pool against the same GPUs
split three ways, side by side in one run.

Runs ``jupyterhub_gpupool.simulate.mixed`` (the same code as ``jupyterhub-gpupool simulate
mixed``): generated notebook sessions (``--users``, one day per seed of ``--seeds``), one day of
NotebookOS's Sensei-derived training trace (``benchmarks/data/notebookos-sensei/``) and the
module's inference services, on 12 nodes of 8 H100s: all in one pool, and split three ways
(notebooks / training / inference nodes) for each split of ``--splits`` (default 3/8/1, 4/7/1
and 5/6/1; the one pool is the same 12 nodes whatever the split). Prints a table and the
issue's verdict (one pool serves at least 25 % more training GPU-hours at a notebook p95 wait
no worse, no inference preemption) per seed and split, and writes
``benchmarks/results/mixed_pool.json``. ``--no-waiter-preemption`` replays with
``classes.training.preempt_for_waiters: false`` (a long-waiting training only waits);
``--no-idle-reclaim`` replays without the reclaimer (notebooks hold their GPU until their user
stops them; by default idle notebooks are reclaimed by the pool's default policy, in the one
pool and in the split's notebook share alike). ``--keep-free N`` replays the one pool with
``borrowing: {keep_free: N}`` (``pool.headroom``: borrowed training leaves N GPUs free, and
is preempted to refill them when notebooks or services used them; the split pools as they
are; the JSON is then ``..._keep_free_N.json``).

    nice -n 15 python benchmarks/mixed_pool.py --all-days --jobs 2 --splits 3/8/1 --keep-free 2

    nice -n 15 python benchmarks/mixed_pool.py [--users 30] [--seeds 1,2,3] [--splits 5/6/1]

``--days a-b`` (or ``--day N``, ``--all-days`` for the month's 30) replays those days of the
trace instead of day 1, with the same notebooks and services each day; seed 1 and the splits
3/8/1 and 5/6/1 unless told. It prints a row per day (the day's training ask, GPU-hours
served by the one pool and each split, the gain, the notebook p95 waits, inference
preemptions) and a summary (the gain's median and spread, the days the goal is met, the gain
against the share of the ask the split already serves), and writes
``benchmarks/results/mixed_pool_days.json``. ``--jobs 2`` replays two days at a time.

    nice -n 15 python benchmarks/mixed_pool.py --all-days --jobs 2
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.pool.workloads import (  # noqa: E402
    DEFAULT_CLASSES,
    INFERENCE,
    INTERACTIVE,
    TRAINING,
)
from jupyterhub_gpupool.simulate import mixed  # noqa: E402
from jupyterhub_gpupool.simulate.tables import aligned  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRACE = ROOT / mixed.DEFAULT_TRACE
SPLITS = "3/8/1,4/7/1,5/6/1"
#: The splits and seeds of a sweep over days (``--days``) unless told.
DAY_SPLITS = "3/8/1,5/6/1"
DAY_SEEDS = [1]
GOAL = 0.25


def _seeds(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError("a comma list of whole numbers, e.g. 1,2,3")
    return values


def _splits(text: str) -> list[dict[str, int]]:
    """``3/8/1,5/6/1``: notebook / training / inference nodes, each split 12 nodes in all."""
    out = []
    for part in text.split(","):
        try:
            n = [int(x) for x in part.split("/")]
        except ValueError:
            n = []
        if len(n) != 3 or min(n) < 1 or sum(n) != sum(mixed.SPLIT.values()):
            raise argparse.ArgumentTypeError(
                f"splits are N/N/N nodes (notebooks/training/inference, each at least 1, "
                f"{sum(mixed.SPLIT.values())} in all), comma separated; got {part!r}"
            )
        out.append(dict(zip((INTERACTIVE, TRAINING, INFERENCE), n, strict=True)))
    return out


def _days(text: str) -> list[int]:
    """``7`` or ``3-9``: days of the month's trace (0-29)."""
    lo, _, hi = text.partition("-")
    try:
        days = list(range(int(lo), int(hi or lo) + 1))
    except ValueError:
        days = []
    if not days or days[0] not in mixed.DAYS or days[-1] not in mixed.DAYS:
        first, last = mixed.DAYS[0], mixed.DAYS[-1]
        raise argparse.ArgumentTypeError(
            f"a day N or days A-B from {first} to {last}, e.g. 1 or {first}-{last}; got {text!r}"
        )
    return days


def label(split: dict[str, int]) -> str:
    return "/".join(str(split[c]) for c in (INTERACTIVE, TRAINING, INFERENCE))


def replay(
    trace: str,
    day: int,
    seed: int,
    users: int,
    splits: Sequence[dict[str, int]],
    waiter_preemption: bool,
    idle_reclaim: bool,
    keep_free: int = 0,
) -> dict[str, Any]:
    """One day, one seed: the one pool once (keeping ``keep_free`` GPUs from borrowed
    training), each split; the figures and the verdicts."""
    classes = dict(DEFAULT_CLASSES)
    if not waiter_preemption:
        classes[TRAINING] = replace(classes[TRAINING], preempt_for_waiters=False)
    work, source = mixed.build(users, seed, trace, day)
    one = mixed.Replay(
        work,
        "one-pool",
        splits[0],
        classes=classes,
        idle_reclaim=idle_reclaim,
        keep_free=keep_free,
    )
    figs = [one.run()]
    verdicts = {}
    for split in splits:
        alone = mixed.Replay(work, "split", split, classes=classes, idle_reclaim=idle_reclaim)
        fig = alone.run()
        verdicts[label(split)] = mixed.verdict([figs[0], fig])
        figs.append(replace(fig, mode=f"split {label(split)}"))
    return {
        "day": day,
        "seed": seed,
        "keep_free": keep_free,
        "source": source,
        "results": [asdict(f) for f in figs],
        "verdicts": verdicts,
    }


def _replay(task: tuple[Any, ...]) -> dict[str, Any]:
    return replay(*task)


def day_row(run: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """A day's figures for the table: the ask, what each arm served, gain and waits."""
    one, *splits = run["results"]
    ask = one["training_demand_gpu_hours"]
    row: dict[str, Any] = {
        "day": run["day"],
        "seed": run["seed"],
        "trainings": one["trainings"],
        "ask_gpu_hours": ask,
        "one_pool_gpu_hours": one["training_gpu_hours"],
        "one_pool_p95_s": one["notebook_wait_p95_s"],
        "headroom_preemptions": one.get("headroom_preemptions", 0),
        "inference_preemptions": sum(r["preemptions"].get(INFERENCE, 0) for r in run["results"]),
        "splits": {},
    }
    for name, fig in zip(names, splits, strict=True):
        v = run["verdicts"][name]
        served = fig["training_gpu_hours"]
        row["splits"][name] = {
            "gpu_hours": served,
            "share_of_ask": served / ask if ask else 0.0,
            # what serving the whole ask would gain: no way of pooling can gain more
            "bound": ask / served - 1 if served else 0.0,
            "gain": v["training_gain"],
            "p95_s": fig["notebook_wait_p95_s"],
            "gain_ok": v["training_ok"],
            "wait_ok": v["wait_ok"],
            "met": v["met"],
        }
    return row


def day_table(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> str:
    head = ["day", "trainings", "ask GPU-h", "one pool GPU-h", "p95 s"]
    for name in names:
        head += [f"{name} GPU-h", "of ask", "gain", "bound", "p95 s", "goal"]
    table = [[*head, "inference preempt."]]
    for r in rows:
        cells = [
            f"{r['day']}" + (f" s{r['seed']}" if r["seed"] != 1 else ""),
            f"{r['trainings']}",
            f"{r['ask_gpu_hours']:.1f}",
            f"{r['one_pool_gpu_hours']:.1f}",
            f"{r['one_pool_p95_s']:.0f}",
        ]
        for name in names:
            s = r["splits"][name]
            goal = "met" if s["met"] else "gain" if not s["gain_ok"] else "wait"
            cells += [
                f"{s['gpu_hours']:.1f}",
                f"{s['share_of_ask']:.0%}",
                f"{s['gain']:+.0%}",
                f"{s['bound']:+.0%}",
                f"{s['p95_s']:.0f}",
                goal,
            ]
        table.append([*cells, f"{r['inference_preemptions']}"])
    return aligned(table)


def summary(rows: Sequence[dict[str, Any]], names: Sequence[str]) -> dict[str, Any]:
    """Per split: the gain's median and spread over the days, the days each condition of the
    goal holds, and how the gain follows the share of the ask the split already serves."""
    out: dict[str, Any] = {"days": len(rows)}
    for name in names:
        s = [r["splits"][name] for r in rows]
        gains = sorted(x["gain"] for x in s)
        shares = [x["share_of_ask"] for x in s]
        varied = len(set(shares)) > 1 and len(set(gains)) > 1
        q = statistics.quantiles(gains, n=4, method="inclusive") if len(gains) > 1 else gains * 3
        out[name] = {
            "gain_median": statistics.median(gains),
            "gain_min": gains[0],
            "gain_q1": q[0],
            "gain_q3": q[-1],
            "gain_max": gains[-1],
            "days_gain_ok": [r["day"] for r, x in zip(rows, s, strict=True) if x["gain_ok"]],
            "days_wait_ok": [r["day"] for r, x in zip(rows, s, strict=True) if x["wait_ok"]],
            "days_met": [r["day"] for r, x in zip(rows, s, strict=True) if x["met"]],
            "days_bound_below_goal": [
                r["day"] for r, x in zip(rows, s, strict=True) if x["bound"] < GOAL
            ],
            "gain_vs_share_correlation": (
                statistics.correlation(shares, [x["gain"] for x in s])
                if len(s) > 2 and varied
                else None
            ),
        }
    p95 = sorted(r["one_pool_p95_s"] for r in rows)
    out["one_pool_p95_min"], out["one_pool_p95_max"] = p95[0], p95[-1]
    out["one_pool_p95_median"] = statistics.median(p95)
    out["inference_preemptions"] = sum(r["inference_preemptions"] for r in rows)
    out["headroom_preemptions"] = sum(r.get("headroom_preemptions", 0) for r in rows)
    return out


def format_summary(summ: dict[str, Any], names: Sequence[str]) -> str:
    n = summ["days"]
    lines = []
    for name in names:
        x = summ[name]
        corr = x["gain_vs_share_correlation"]
        lines.append(
            f"split {name}: gain median {x['gain_median']:+.0%} (min {x['gain_min']:+.0%}, "
            f"quartiles {x['gain_q1']:+.0%} / {x['gain_q3']:+.0%}, max {x['gain_max']:+.0%}); "
            f"gain >= +{GOAL:.0%} on {len(x['days_gain_ok'])} of {n} days, notebook p95 no worse "
            f"on {len(x['days_wait_ok'])}, goal met on {len(x['days_met'])}"
            + (f" (days {', '.join(map(str, x['days_met']))})" if x["days_met"] else "")
            + f"; serving the whole ask would gain under +{GOAL:.0%} on "
            f"{len(x['days_bound_below_goal'])} days"
            + (f"; gain vs the split's share of the ask: r = {corr:.2f}" if corr else "")
        )
    lines.append(
        f"one pool notebook p95: median {summ['one_pool_p95_median']:.0f} s (min "
        f"{summ['one_pool_p95_min']:.0f} s, max {summ['one_pool_p95_max']:.0f} s); training "
        f"preemptions to refill the headroom: {summ['headroom_preemptions']}"
    )
    lines.append(f"inference preemptions over all days: {summ['inference_preemptions']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--users", type=int, default=30, help="notebook users; default 30")
    parser.add_argument(
        "--seeds",
        type=_seeds,
        default=None,
        help="default 1,2,3 (with --days: 1)",
    )
    parser.add_argument(
        "--splits",
        type=_splits,
        default=None,
        help=f"notebook/training/inference nodes of the split pools; default {SPLITS} "
        f"(with --days: {DAY_SPLITS})",
    )
    which = parser.add_mutually_exclusive_group()
    which.add_argument(
        "--days",
        "--day",
        type=_days,
        default=None,
        metavar="A-B",
        help="replay these days of the trace (N or A-B), a row each; default day "
        f"{mixed.DEFAULT_DAY} with the full tables",
    )
    which.add_argument(
        "--all-days",
        dest="days",
        action="store_const",
        const=list(mixed.DAYS),
        help=f"replay every day of the month ({mixed.DAYS[0]}-{mixed.DAYS[-1]})",
    )
    parser.add_argument(
        "--trace", default=str(TRACE), help=f"the trace; default {TRACE.relative_to(ROOT)}"
    )
    parser.add_argument(
        "--jobs", type=int, default=1, help="days replayed at once (processes); default 1"
    )
    parser.add_argument(
        "--no-waiter-preemption",
        action="store_true",
        help="replay with classes.training.preempt_for_waiters: false",
    )
    parser.add_argument(
        "--no-idle-reclaim",
        dest="idle_reclaim",
        action="store_false",
        help="notebooks are never reclaimed for being idle (the pool's default reclaims them)",
    )
    parser.add_argument(
        "--keep-free",
        type=int,
        default=0,
        metavar="N",
        help="the one pool keeps N GPUs free of borrowed training (borrowing: {keep_free: N}, "
        "with its refill); default 0: none",
    )
    parser.add_argument("--out", default=None, help="JSON path")
    args = parser.parse_args(argv)
    if not 0 <= args.keep_free <= mixed.GPUS_PER_NODE * sum(mixed.SPLIT.values()):
        parser.error(f"--keep-free: a whole number of GPUs the pool has, got {args.keep_free}")
    sweep = args.days is not None
    days = args.days if sweep else [mixed.DEFAULT_DAY]
    seeds = args.seeds or (DAY_SEEDS if sweep else [1, 2, 3])
    splits = args.splits or _splits(DAY_SPLITS if sweep else SPLITS)
    names = [label(s) for s in splits]
    stem = "mixed_pool_days" if sweep else "mixed_pool"
    stem += f"_keep_free_{args.keep_free}" if args.keep_free else ""
    out = Path(args.out or RESULTS / f"{stem}.json")
    waiter = not args.no_waiter_preemption
    tasks = [
        (args.trace, d, seed, args.users, splits, waiter, args.idle_reclaim, args.keep_free)
        for d in days
        for seed in seeds
    ]
    began = time.perf_counter()
    if args.jobs > 1 and len(tasks) > 1:
        with ProcessPoolExecutor(min(args.jobs, len(tasks))) as pool:
            runs = list(pool.map(_replay, tasks))
    else:
        runs = [_replay(t) for t in tasks]
    wall = time.perf_counter() - began
    cpu = sum(r["seconds"] for run in runs for r in run["results"])
    body: dict[str, Any] = {
        "users": args.users,
        "trace": args.trace,
        "days_replayed": days,
        "seeds": seeds,
        "splits": [dict(s) for s in splits],
        "preempt_for_waiters": waiter,
        "idle_reclaim": args.idle_reclaim,
        "keep_free": args.keep_free,
        "gpus_per_node": mixed.GPUS_PER_NODE,
        "services": [list(s) for s in mixed.SERVICES],
        "days": runs,
    }
    if sweep:
        rows = [day_row(run, names) for run in runs]
        summ = summary(rows, names)
        print(
            f"{args.users} notebook users (seeds {seeds}), trace {args.trace}"
            + (f"; the one pool keeps {args.keep_free} GPUs free" if args.keep_free else "")
        )
        print(day_table(rows, names))
        print(format_summary(summ, names))
        body |= {"rows": rows, "summary": summ}
    else:
        for run in runs:
            print(f"\n{run['source']}")
            figs = [mixed.Figures(**r) for r in run["results"]]
            print(mixed.format_table(figs))
            for name, v in run["verdicts"].items():
                print(f"split {name}:{mixed.format_verdict(v)}")
        print()
        for name in names:
            gains = ", ".join(f"{r['verdicts'][name]['training_gain']:+.0%}" for r in runs)
            met = sum(r["verdicts"][name]["met"] for r in runs)
            print(f"split {name}: training gain {gains}; goal met on {met} of {len(runs)} seeds")
    print(f"({wall:.1f} s wall, {cpu:.1f} s CPU in the replays)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

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
pool and in the split's notebook share alike).

    nice -n 15 python benchmarks/mixed_pool.py [--users 30] [--seeds 1,2,3] [--splits 5/6/1]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
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

RESULTS = ROOT / "benchmarks" / "results"
TRACE = ROOT / mixed.DEFAULT_TRACE
SPLITS = "3/8/1,4/7/1,5/6/1"


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


def label(split: dict[str, int]) -> str:
    return "/".join(str(split[c]) for c in (INTERACTIVE, TRAINING, INFERENCE))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--users", type=int, default=30, help="notebook users; default 30")
    parser.add_argument("--seeds", type=_seeds, default=[1, 2, 3], help="default 1,2,3")
    parser.add_argument(
        "--splits",
        type=_splits,
        default=_splits(SPLITS),
        help=f"notebook/training/inference nodes of the split pools; default {SPLITS}",
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
    parser.add_argument("--out", default=str(RESULTS / "mixed_pool.json"), help="JSON path")
    args = parser.parse_args(argv)
    classes = dict(DEFAULT_CLASSES)
    if args.no_waiter_preemption:
        classes[TRAINING] = replace(classes[TRAINING], preempt_for_waiters=False)
    began = time.perf_counter()
    days: list[dict[str, Any]] = []
    for seed in args.seeds:
        work, source = mixed.build(args.users, seed, TRACE)
        one = mixed.Replay(
            work, "one-pool", args.splits[0], classes=classes, idle_reclaim=args.idle_reclaim
        ).run()
        figs, verdicts = [one], {}
        for split in args.splits:
            alone = mixed.Replay(
                work, "split", split, classes=classes, idle_reclaim=args.idle_reclaim
            ).run()
            verdicts[label(split)] = mixed.verdict([one, alone])
            figs.append(replace(alone, mode=f"split {label(split)}"))
        print(f"\n{source}")
        print(mixed.format_table(figs))
        for name, v in verdicts.items():
            print(f"split {name}:{mixed.format_verdict(v)}")
        days.append({"seed": seed, "results": [asdict(f) for f in figs], "verdicts": verdicts})
    print()
    for split in args.splits:
        name = label(split)
        gains = ", ".join(f"{d['verdicts'][name]['training_gain']:+.0%}" for d in days)
        met = sum(d["verdicts"][name]["met"] for d in days)
        print(f"split {name}: training gain {gains}; goal met on {met} of {len(days)} days")
    print(f"({time.perf_counter() - began:.1f} s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "users": args.users,
        "trace": str(TRACE.relative_to(ROOT)),
        "splits": [dict(s) for s in args.splits],
        "preempt_for_waiters": classes[TRAINING].preempt_for_waiters,
        "idle_reclaim": args.idle_reclaim,
        "gpus_per_node": mixed.GPUS_PER_NODE,
        "services": [list(s) for s in mixed.SERVICES],
        "days": days,
    }
    out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""The what-if replay's cost: recorded requests per second through the real allocator.

A synthetic history (no database: the replay's own ``Record`` values) of ``--per-day`` requests
a day on a pool of ``--gpus`` whole H100s and dynamic-MIG A100s (half each), arrivals spread
over working hours, holds of 30 min to 4 h, one in ten withdrawn while waiting, is replayed
for 30 and 365 days with two more GPUs of each model. Figures: requests, seconds (process
time), requests per second.

Run ``python benchmarks/whatif_replay.py`` (``--per-day 400 --gpus 64``); JSON goes to
``benchmarks/results/whatif_replay.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from datetime import datetime, timedelta
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.pool.catalog import default_catalog  # noqa: E402
from jupyterhub_gpupool.pool.model import Gpu, Node, parse_offer  # noqa: E402
from jupyterhub_gpupool.pool.quota import QuotaBook, QuotaSpec  # noqa: E402
from jupyterhub_gpupool.pool.reclaimpolicy import PolicySet  # noqa: E402
from jupyterhub_gpupool.simulate.whatif import Change, changed_inventory, replay  # noqa: E402
from jupyterhub_gpupool.store.planning import Record  # noqa: E402

END = datetime(2026, 12, 1)


def pool(gpus: int):
    catalog = default_catalog()
    h100, a100 = catalog.model("H100-80GB"), catalog.model("A100-80GB")
    nodes = []
    for n in range(gpus // 8):
        model, mig = (h100, False) if n % 2 == 0 else (a100, True)
        name = f"node-{n}"
        nodes.append(
            Node(
                name,
                "default",
                0,
                0,
                [Gpu(f"G-{n}-{i}", i, model, name, mig, mig) for i in range(8)],
            )
        )
    offers = [
        parse_offer({"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}, catalog),
        parse_offer(
            {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
            catalog,
        ),
        parse_offer(
            {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
            catalog,
        ),
    ]
    return nodes, offers, catalog


def history(days: int, per_day: int, seed: int = 7) -> list[Record]:
    rng = random.Random(seed)
    out = []
    start = END - timedelta(days=days)
    for d in range(days):
        for i in range(per_day):
            asked = start + timedelta(days=d, hours=rng.uniform(8, 18))
            hold = timedelta(minutes=rng.uniform(30, 240))
            wait = timedelta(minutes=rng.expovariate(1 / 10))
            withdrawn = rng.random() < 0.1
            granted = None if withdrawn else asked + wait
            released = (asked + wait) if withdrawn else asked + wait + hold
            offer = rng.choice(["h100", "a100-3g", "a100-1g", "a100-1g"])
            out.append(
                Record(
                    f"r{d}-{i}",
                    f"user{rng.randrange(300)}",
                    "",
                    offer,
                    None,
                    (),
                    (),
                    0,
                    asked,
                    granted,
                    min(released, END),
                    1.0 if offer == "h100" else 0.5,
                    hold.total_seconds() / 3600 * rng.random(),
                    "stopped",
                    "no_capacity" if wait else None,
                )
            )
    return sorted(out, key=lambda r: r.created)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-day", type=int, default=400)
    ap.add_argument("--gpus", type=int, default=64)
    args = ap.parse_args()
    figures = []
    for days in (30, 365):
        nodes, offers, catalog = pool(args.gpus)
        change = Change(add={"H100-80GB": 2, "A100-80GB": 2})
        inventory = changed_inventory(nodes, offers, change, catalog)
        records = history(days, args.per_day)
        book = QuotaBook(default_user=QuotaSpec(limit=Fraction(2)))
        began = time.process_time()
        out = replay(
            records, inventory, offers, book, END - timedelta(days=days), END,
            old_policy=PolicySet(),
        )  # fmt: skip
        seconds = time.process_time() - began
        served = sum(o["served"] for o in out)
        row = {
            "days": days,
            "requests": len(records),
            "served": served,
            "seconds": round(seconds, 2),
            "requests_per_second": round(len(records) / seconds) if seconds else None,
        }
        figures.append(row)
        print(
            f"{days:>4} days, {len(records):>7} requests on {args.gpus + 4} GPUs: "
            f"{seconds:6.2f} s ({row['requests_per_second']} requests/s), {served} served"
        )
    result = {
        "benchmark": "whatif_replay",
        "per_day": args.per_day,
        "gpus": args.gpus,
        "python": platform.python_version(),
        "figures": figures,
    }
    path = ROOT / "benchmarks" / "results" / "whatif_replay.json"
    path.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Mixed-pool benchmark: notebooks, training and inference on one pool against the same GPUs
split three ways, side by side in one run.

Runs ``jupyterhub_gpupool.simulate.mixed`` (the same code as ``jupyterhub-gpupool simulate
mixed``): generated notebook sessions (``--users``, one day per seed of ``--seeds``), one day of
NotebookOS's Sensei-derived training trace (``benchmarks/data/notebookos-sensei/``) and the
module's inference services, on 12 nodes of 8 H100s: all in one pool, and split 3 / 8 / 1 nodes
(notebooks / training / inference). Prints a table and the issue's verdict (one pool serves at
least 25 % more training GPU-hours at a notebook p95 wait no worse, no inference preemption)
per seed, and writes ``benchmarks/results/mixed_pool.json``.

    nice -n 15 python benchmarks/mixed_pool.py [--users 30] [--seeds 1,2,3]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.simulate import mixed  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRACE = ROOT / mixed.DEFAULT_TRACE


def _seeds(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values:
        raise argparse.ArgumentTypeError("a comma list of whole numbers, e.g. 1,2,3")
    return values


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--users", type=int, default=30, help="notebook users; default 30")
    parser.add_argument("--seeds", type=_seeds, default=[1, 2, 3], help="default 1,2,3")
    parser.add_argument("--out", default=str(RESULTS / "mixed_pool.json"), help="JSON path")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    days: list[dict[str, Any]] = []
    for seed in args.seeds:
        work, source = mixed.build(args.users, seed, TRACE)
        figs = mixed.run_all(work)
        v = mixed.verdict(figs)
        print(f"\n{source}")
        print(mixed.format_table(figs))
        print(mixed.format_verdict(v))
        days.append({"seed": seed, "results": [asdict(f) for f in figs], "verdict": v})
    met = sum(d["verdict"]["met"] for d in days)
    print(f"\ngoal met on {met} of {len(days)} days ({time.perf_counter() - began:.1f} s)")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "users": args.users,
        "trace": str(TRACE.relative_to(ROOT)),
        "split_nodes": dict(mixed.SPLIT),
        "gpus_per_node": mixed.GPUS_PER_NODE,
        "services": [list(s) for s in mixed.SERVICES],
        "days": days,
    }
    out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Kernel-lease benchmark: server-level against kernel-level GPU leases, side by side in one run.

Runs ``jupyterhub_gpupool.simulate.kernels`` (the same code as ``jupyterhub-gpupool simulate
kernels``) on two days: the session generator (200 users, seeds 1-3, the reclaim benchmark's
40-GPU pool; means over the seeds) and one day of NotebookOS's Sensei-derived job trace
(``benchmarks/data/notebookos-sensei/``, 12 nodes of 8 H100s). Rows: servers holding their GPU
for life, servers under the pool's idle reclaim, and kernel leases given back after K minutes of
kernel idleness for each K of ``--keep``. Prints one table per day and, per K, whether the
issue's goal (at least 50 % fewer GPU-hours held than server leases at an equal or better p95
wait) is met, and writes ``benchmarks/results/kernel_leases.json``.

    nice -n 15 python benchmarks/kernel_leases.py [--seeds 1,2,3] [--keep 0,5,15,30,60]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, fields
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.simulate import kernels  # noqa: E402
from jupyterhub_gpupool.simulate.sessions import generate  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
TRACE = ROOT / "benchmarks" / "data" / "notebookos-sensei" / "sensei_june_day1.csv"


def _ints(text: str) -> list[int]:
    try:
        values = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        values = []
    if not values or min(values) < 0:
        raise argparse.ArgumentTypeError("a comma list of whole numbers >= 0, e.g. 1,2,3")
    return values


def one_day(task: tuple[str, int, list[str], float]) -> tuple[str, int, list[kernels.Figures]]:
    """One day under every row: ``seed N`` of the generator, or the trace."""
    name, users, names, overhead = task
    if name == "trace":
        sessions = kernels.load_trace(TRACE)
        return name, len(sessions), kernels.run_all(sessions, kernels.trace_pool(), names, overhead)
    sessions = generate(users, int(name.split()[-1]))
    return name, len(sessions), kernels.run_all(sessions, kernels.generator_pool, names, overhead)


def mean_figures(runs: list[list[kernels.Figures]]) -> list[kernels.Figures]:
    """Per row, the mean of every figure over the seeds."""
    out = []
    for per_policy in zip(*runs, strict=True):
        mean = kernels.Figures(per_policy[0].policy)
        for f in fields(kernels.Figures):
            if f.name != "policy":
                values = [getattr(x, f.name) for x in per_policy]
                setattr(mean, f.name, sum(values) / len(values))
        out.append(mean)
    return out


def _rows(figs: list[kernels.Figures]) -> list[dict[str, Any]]:
    return [{**asdict(f), "idle_share": f.idle_share} for f in figs]


def seed_verdicts(
    seeds: list[tuple[str, int, list[kernels.Figures]]],
    mean: list[kernels.Figures],
    baseline: str,
) -> list[dict[str, Any]]:
    """Print, per kernel row, in how many seeds the goal against ``baseline`` is met."""
    per_seed = [kernels.verdicts(figs, baseline) for _, _, figs in seeds]
    out = []
    for i, v in enumerate(kernels.verdicts(mean, baseline)):
        met = sum(vs[i]["met"] for vs in per_seed)
        cuts = ", ".join(f"{vs[i]['held_cut']:.0%}" for vs in per_seed)
        bounds = ", ".join(f"{vs[i]['bound']:.0%}" for vs in per_seed)
        p95 = ", ".join(f"{vs[i]['p95_s']:.0f} vs {vs[i]['baseline_p95_s']:.0f}" for vs in per_seed)
        flag = "met    " if met == len(per_seed) else "NOT MET"
        print(
            f"  {flag} in {met}/{len(per_seed)} seeds  {v['policy']} vs {baseline}: held "
            f"{cuts} less (at most {bounds} possible); p95 {p95} s"
        )
        out.append({**v, "day": "generated", "met_in": met, "seeds": len(per_seed)})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=_ints, default=[1, 2, 3])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--keep", type=_ints, default=list(kernels.KEEP_MINUTES))
    parser.add_argument("--overhead", type=float, default=kernels.OVERHEAD)
    parser.add_argument("--json", default=str(RESULTS / "kernel_leases.json"))
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    names = kernels.policies(args.keep)
    began = time.perf_counter()
    tasks = [(f"seed {s}", args.users, names, args.overhead) for s in args.seeds]
    tasks.append(("trace", 0, names, args.overhead))
    with ProcessPoolExecutor(max_workers=max(1, args.workers)) as pool:
        results = list(pool.map(one_day, tasks))
    seeds = [(n, count, figs) for n, count, figs in results if n != "trace"]
    _, trace_count, trace_figs = next(r for r in results if r[0] == "trace")
    mean = mean_figures([figs for _, _, figs in seeds])
    body: dict[str, Any] = {"overhead_s": args.overhead, "keep_minutes": args.keep}
    print(f"kernel-lease benchmark; lease + kernel start overhead {args.overhead:g} s")
    print(
        f"\ngenerated day, 40 GPUs, {args.users} users, seeds {args.seeds} "
        f"({', '.join(str(c) for _, c, _ in seeds)} sessions); means over the seeds:"
    )
    print(kernels.format_table(mean))
    goal: list[dict[str, Any]] = []
    for baseline in ("server-reclaim", "server"):
        goal += seed_verdicts(seeds, mean, baseline)
    print(f"\nNotebookOS's Sensei trace, its second day ({trace_count} sessions), 96 H100s:")
    print(kernels.format_table(trace_figs))
    for baseline in ("server-reclaim", "server"):
        vs = kernels.verdicts(trace_figs, baseline)
        for line in kernels.format_verdicts(vs):
            print(line)
        goal += [{**v, "day": "trace"} for v in vs]
    elapsed = time.perf_counter() - began
    print(f"{elapsed:.0f} s")
    body.update(
        generated={
            "users": args.users,
            "seeds": args.seeds,
            "sessions": {n: c for n, c, _ in seeds},
            "mean": _rows(mean),
            "per_seed": {n: _rows(figs) for n, _, figs in seeds},
        },
        trace={
            "file": str(TRACE.relative_to(ROOT)),
            "sessions": trace_count,
            "results": _rows(trace_figs),
        },
        goal=goal,
        elapsed_s=elapsed,
    )
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(body, indent=2) + "\n")
    print(f"wrote {out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

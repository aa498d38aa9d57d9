"""Packing benchmark: the FGD paper's workload-tuning experiment on three Alibaba traces.

Runs ``jupyterhub_gpupool.simulate.packing`` (the same code as ``jupyterhub-gpupool simulate
packing``) on the default, gpushare40 and multigpu20 traces with seeds 42-51, writes
``benchmarks/results/packing-<trace>.json`` and prints, per trace, the tables and a summary
against the published BestFit and FGD means (Weng et al., USENIX ATC 2023).

    python benchmarks/packing.py [--seeds 42-51] [--traces default,gpushare40,multigpu20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from jupyterhub_gpupool.simulate import packing  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "alibaba-gpu-v2023"
RESULTS = ROOT / "benchmarks" / "results"
NODES = DATA / "openb_node_list_gpu_node.csv"
TRACES = ("default", "gpushare40", "multigpu20")
POLICIES = ("ours", "best-fit", "fgd", "ours-typical")
BEST_FIT_TOLERANCE = 0.5  # percentage points: the validation bar for our BestFit


def _traces(text: str) -> list[str]:
    names = [t.strip() for t in text.split(",") if t.strip()]
    bad = [t for t in names if not (DATA / f"openb_pod_list_{t}.csv").is_file()]
    if not names or bad:
        raise argparse.ArgumentTypeError(
            f"--traces: unknown {', '.join(bad) or '(empty)'}; available: "
            + ", ".join(p.stem.removeprefix("openb_pod_list_") for p in DATA.glob("openb_pod_*"))
        )
    return names


def _policies(text: str) -> list[str]:
    names = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in names if p not in POLICIES]
    if not names or bad:
        raise argparse.ArgumentTypeError(f"--policies: choose from {', '.join(POLICIES)}")
    return names


def summary_lines(report: dict) -> list[str]:
    """Gaps to the published means: ours and best-fit vs BestFit, fgd vs FGD (alloc points)."""
    pub = report["published"]
    if not pub:
        return ["  (no published figures for this trace)"]
    lines = []
    pols = report["policies"]
    for k in (str(p) for p in packing.ARRIVED_POINTS):
        bf, fg = pub["best-fit"][k]["alloc_pct"], pub["fgd"][k]["alloc_pct"]
        parts = [f"  {k:>3}%: published BestFit {bf:7.3f}  FGD {fg:7.3f}"]
        if "ours" in pols:
            parts.append(f"ours-BestFit {pols['ours'][k]['alloc_pct'] - bf:+6.3f}")
            parts.append(f"ours-FGD {pols['ours'][k]['alloc_pct'] - fg:+6.3f}")
        if "best-fit" in pols:
            gap = pols["best-fit"][k]["alloc_pct"] - bf
            flag = "ok" if abs(gap) <= BEST_FIT_TOLERANCE else "OUT"
            parts.append(f"best-fit gap {gap:+6.3f} ({flag})")
        if "fgd" in pols:
            parts.append(f"fgd gap {pols['fgd'][k]['alloc_pct'] - fg:+6.3f}")
        lines.append("  ".join(parts))
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=packing.parse_seeds, default=packing.parse_seeds("42-51"))
    parser.add_argument("--traces", type=_traces, default=list(TRACES))
    parser.add_argument(
        "--policies",
        type=_policies,
        default=list(POLICIES),
        help="default: all four (ours-typical is ours without the multi-GPU demand tweak)",
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    RESULTS.mkdir(parents=True, exist_ok=True)
    summary: list[str] = []
    for name in args.traces:
        pods_csv = DATA / f"openb_pod_list_{name}.csv"
        started = time.perf_counter()
        report = packing.run_experiment_report(
            pods_csv, NODES, args.seeds, args.policies, workers=args.workers
        )
        wall = time.perf_counter() - started
        out = RESULTS / f"packing-{name}.json"
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\n=== {report['trace']}: {len(args.seeds)} seeds, {wall:.0f} s -> {out}")
        for policy, means in report["policies"].items():
            print()
            print(packing.format_table(policy, means, report["published"]))
        summary.append(f"{report['trace']} ({wall:.0f} s)")
        summary.extend(summary_lines(report))
    print("\n=== summary (allocation %, gaps in points)")
    print("\n".join(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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
POLICIES = packing.ALL_POLICIES
DEFAULT_POLICIES = ("ours", "best-fit", "fgd")
CHART = ROOT / "docs" / "source" / "_static" / "packing" / "alloc-vs-arrived.png"
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
        default=list(DEFAULT_POLICIES),
        help=f"default: {','.join(DEFAULT_POLICIES)}; also the ablation variants "
        f"{', '.join(p for p in POLICIES if p not in DEFAULT_POLICIES)}",
    )
    parser.add_argument(
        "--from-results",
        action="store_true",
        help="do not simulate: print the table and draw the chart from the saved results",
    )
    parser.add_argument(
        "--tag",
        default="",
        help="suffix of the results files (packing-<trace><tag>.json), e.g. -ablation",
    )
    parser.add_argument(
        "--chart",
        type=lambda text: Path(text) if text else None,
        default=CHART,
        help="PNG of allocation %% vs arrived %% per policy (matplotlib); '' to skip",
    )
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)

    RESULTS.mkdir(parents=True, exist_ok=True)
    reports = []
    for name in args.traces if args.from_results else ():
        reports.append(json.loads((RESULTS / f"packing-{name}{args.tag}.json").read_text()))
    for name in () if args.from_results else args.traces:
        pods_csv = DATA / f"openb_pod_list_{name}.csv"
        started = time.perf_counter()
        report = packing.run_experiment_report(
            pods_csv, NODES, args.seeds, args.policies, workers=args.workers
        )
        report["wall_s"] = round(time.perf_counter() - started, 1)
        out = RESULTS / f"packing-{name}{args.tag}.json"
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"{report['trace']}: {len(args.seeds)} seeds, {report['wall_s']:.0f} s -> {out}")
        reports.append(report)
    print()
    print(comparison_table(reports))
    if args.chart is not None:
        bound = RESULTS / "packing-bound.json"
        path = write_chart(reports, bound if bound.is_file() else None, args.chart)
        if path:
            print(f"\nchart: {path}")
    return 0


def comparison_table(reports: list[dict]) -> str:
    """One table for the run: allocation % per trace, arrived point and policy, published too."""
    policies = list(reports[0]["policies"]) if reports else []
    cols = [*policies, "FGD pub", "BestFit pub", "ours-FGD pub"]
    head = f"{'trace':<12} {'arr%':>4} " + " ".join(f"{c:>12}" for c in cols)
    lines = [
        f"allocation % of GPU capacity, mean of seeds {packing._seeds_text(reports[0]['seeds'])}"
        if reports
        else "",
        head,
        "-" * len(head),
    ]
    for r in reports:
        pub = r["published"]
        for k in (str(p) for p in packing.ARRIVED_POINTS):
            cells = [r["policies"][p][k]["alloc_pct"] for p in policies]
            fgd = pub.get("fgd", {}).get(k, {}).get("alloc_pct")
            bf = pub.get("best-fit", {}).get(k, {}).get("alloc_pct")
            ours = r["policies"].get("ours", {}).get(k, {}).get("alloc_pct")
            gap = ours - fgd if ours is not None and fgd is not None else None
            cells += [fgd, bf, gap]
            trace = r["trace"].removeprefix("openb_pod_list_")
            lines.append(
                f"{trace:<12} {k:>4} "
                + " ".join(f"{'-':>12}" if c is None else f"{c:>12.3f}" for c in cells)
            )
    return "\n".join(lines)


def write_chart(reports: list[dict], bound_json: Path | None, path: Path) -> Path | None:
    """Allocation % vs arrived % per policy and trace, published FGD/BestFit dashed, the bound."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(matplotlib missing: pip install -e '.[bench]' for the chart)", file=sys.stderr)
        return None
    bounds = {}
    if bound_json is not None:
        data = json.loads(bound_json.read_text())
        bounds = {t["trace"]: (data["arrived_pct"], t["bound"]) for t in data["traces"]}
    fig, axes = plt.subplots(1, len(reports), figsize=(4.6 * len(reports), 4.0), squeeze=False)
    xs = list(packing.ARRIVED_POINTS)
    for ax, r in zip(axes[0], reports, strict=True):
        for policy, means in r["policies"].items():
            ys = [means[str(k)]["alloc_pct"] for k in xs]
            ax.plot(xs, ys, marker="o", ms=3, label=policy, lw=2 if policy == "ours" else 1.2)
        for name, style in (("fgd", "--"), ("best-fit", ":")):
            pub = r["published"].get(name)
            if pub:
                ys = [pub[str(k)]["alloc_pct"] for k in xs]
                ax.plot(xs, ys, style, color="grey", lw=1, label=f"published {name}")
        if r["trace"] in bounds:
            at, b = bounds[r["trace"]]
            ax.plot([at], [b["upper_pct"]], "v", color="black", label="upper bound")
            if b.get("packing_found_pct"):
                ax.plot(
                    [at],
                    [b["packing_found_pct"]],
                    "^",
                    color="black",
                    mfc="none",
                    label="packing found (offline)",
                )
        ax.set_title(r["trace"].removeprefix("openb_pod_list_"))
        ax.set_xlabel("arrived workload, % of GPU capacity")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("GPU allocation, % of capacity")
    axes[0][-1].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


if __name__ == "__main__":
    sys.exit(main())

"""The tables of ``service_load.py``: the raw limit of a run beside the service's figures, and
the median and spread over ``--runs``."""

from __future__ import annotations

from statistics import median
from typing import Any


def print_raw(raw: dict[str, Any], runs: list[dict[str, Any]], clients: int) -> None:
    """The raw limit of this run, and each tree's grants/s as a fraction of it."""
    b, p = raw["batched"], raw["per_request"]
    print(
        f"raw limit ({clients} clients, same rows, minimal SQL): batched {b['grants_per_s']:.1f} "
        f"grants/s ({b['transactions_per_s']:.0f} transactions/s, {b['ops_per_transaction']} "
        f"operations each); per-request transactions {p['grants_per_s']:.1f} grants/s"
    )
    for run in runs:
        if run["db"] == "postgresql" and run["clients"] == clients:
            frac = run["grants_per_s"] / b["grants_per_s"] if b["grants_per_s"] else 0.0
            print(f"  {run['tree']}: {run['grants_per_s']:.1f} grants/s = {frac:.0%} of batched")


def request_p99(run: dict[str, Any]) -> float:
    """The worse of the POST and the DELETE p99 (what the target bounds)."""
    return max(run["post_ms"]["p99"] or 0.0, run["delete_ms"]["p99"] or 0.0)


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Median and spread over the runs, per tree and client count, beside the raw limit."""
    raws = result["raw_limit"]
    raw_b = [x["batched"]["grants_per_s"] for x in raws]
    raw_p = [x["per_request"]["grants_per_s"] for x in raws]
    out = []
    keys = dict.fromkeys((x["tree"], x["clients"]) for x in result["runs"])
    for tree, n in keys:
        rs = [x for x in result["runs"] if (x["tree"], x["clients"]) == (tree, n)]
        g = [x["grants_per_s"] for x in rs]
        p99 = [request_p99(x) for x in rs]
        row = {
            "db": result["db"],
            "tree": tree,
            "clients": n,
            "runs": len(rs),
            "grants_per_s": {"median": median(g), "min": min(g), "max": max(g), "all": g},
            "request_p99_ms": {"median": median(p99), "min": min(p99), "max": max(p99), "all": p99},
            "service_cpu_ms_per_grant": median([x["service_cpu_ms_per_grant"] or 0 for x in rs]),
            "store_cpu_ms_per_grant": median([x["store_cpu_ms_per_grant"] or 0 for x in rs]),
            "postgres_cpu_ms_per_grant": median([x["postgres_cpu_ms_per_grant"] or 0 for x in rs]),
            "machine_cores_busy": median([x["cpu_cores_used"]["machine"] or 0 for x in rs]),
            "errors": sum(sum(x["errors"].values()) for x in rs),
        }
        if raw_b and n == max(k[1] for k in keys):
            row["raw_batched_grants_per_s"] = median(raw_b)
            row["raw_per_request_grants_per_s"] = median(raw_p)
            # per run: ours over the raw limit measured right after it, then the median
            fr = [
                x["grants_per_s"] / y["batched"]["grants_per_s"]
                for x in rs
                for y in raws
                if y["run"] == x["run"] and y["batched"]["grants_per_s"]
            ]
            row["fraction_of_raw_batched"] = round(median(fr), 3) if fr else None
        out.append(row)
    return out


def print_summary(rows: list[dict[str, Any]], runs: int) -> None:
    """The medians (and min-max) per tree and client count, one line each."""
    print(f"\n=== median of {runs} run(s) [min-max]")
    print(
        f"{'tree':<6}{'db':<11}{'clients':>8}  {'grants/s':<22}{'request p99 ms':<24}"
        f"{'raw batched':>12}{'ours/raw':>10}{'per-request':>13}  svc/store/pg CPU ms/grant"
    )
    for r in rows:
        g, p = r["grants_per_s"], r["request_p99_ms"]
        raw = r.get("raw_batched_grants_per_s")
        frac = r.get("fraction_of_raw_batched")
        grants = f"{g['median']:.1f} [{g['min']:.1f}-{g['max']:.1f}]"
        p99 = f"{p['median']:.1f} [{p['min']:.1f}-{p['max']:.1f}]"
        raw_s = "" if raw is None else f"{raw:.1f}"
        frac_s = "" if frac is None else f"{frac:.1%}"
        per_req = "" if raw is None else f"{r['raw_per_request_grants_per_s']:.1f}"
        cpu = (
            f"{r['service_cpu_ms_per_grant']:.2f}/{r['store_cpu_ms_per_grant']:.2f}/"
            f"{r['postgres_cpu_ms_per_grant']:.2f}"
        )
        print(
            f"{r['tree']:<6}{r['db']:<11}{r['clients']:>8}  {grants:<22}{p99:<24}"
            f"{raw_s:>12}{frac_s:>10}{per_req:>13}  {cpu}"
        )

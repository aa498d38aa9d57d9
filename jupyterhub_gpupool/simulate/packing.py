"""Replay the FGD paper's packing experiment (workload tuned to 130% of capacity) on a GPU trace.

Re-implements the "workload tuning" experiment of Weng et al., "Beware of Fragmentation:
Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent" (USENIX ATC 2023), as run by
hkust-adsl/kubernetes-scheduler-simulator on the Alibaba GPU trace 2023: the original pods arrive
in a seeded random order, then resampled clones follow until the requested GPU milli reaches 1.3x
the cluster's capacity. Pods never leave; a pod that fits nowhere is dropped. After every arrival
we sample allocated GPU milli and the FGD fragmentation measure, bin the samples on the arrived
workload %, and average the bins over seeds.

Three placement policies are available:

* ``best-fit``: the simulator's BestFit score (integer, min-max normalised), GPU pick "best".
* ``fgd``: the paper's FGD score, ``int(100 * sigmoid(-dF / 1000))``, GPU pick by the same score.
* ``ours``: the pool's placement (FGD's score against a demand with every multi-GPU shape, equal
  scores to a node already in use, then the node order); see :func:`ours_choose`.

Everything that the paper's Go code draws from its global RNG (shuffle, clones, node priority
order) is drawn here from ``numpy.random.default_rng(seed)``, so per-seed numbers differ from the
published ones; only the distribution over seeds is comparable.

The workload tuning, the fragmentation measure and the cluster state live in
``fragmentation`` (re-exported here); this module holds the policies, the replay, the
experiment and its report and command line.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import multiprocessing
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from statistics import fmean as mean
from typing import Any

import numpy as np

from .fragmentation import (
    MAX_PODS_PER_NODE,
    ClusterState,
    Pod,
    TypicalPods,
    model_access,
    node_fragmentation,
    ours_demand,
    ours_node_fragmentation,
    task_access,
    tune_workload,
    typical_pods,
)
from .traces import (
    GPU_MILLI,
    NodeTable,
    PodTable,
    TraceError,
    check_models,
    load_nodes,
    load_pods,
)

__all__ = [
    "ALL_POLICIES",
    "ARRIVED_POINTS",
    "MAX_PODS_PER_NODE",
    "POLICIES",
    "ClusterState",
    "NodeTable",
    "Pod",
    "PodTable",
    "SimResult",
    "TraceError",
    "TypicalPods",
    "add_arguments",
    "best_fit_choose",
    "best_fit_normalise",
    "best_fit_raw",
    "bin_samples",
    "check_models",
    "fgd_choose",
    "fgd_int_score",
    "float_choose",
    "load_nodes",
    "load_pods",
    "load_published",
    "mean_bins",
    "model_access",
    "node_fragmentation",
    "ours_choose",
    "ours_demand",
    "ours_node_fragmentation",
    "parse_policies",
    "parse_seeds",
    "run_cli",
    "run_experiment",
    "run_experiment_report",
    "simulate",
    "task_access",
    "tune_workload",
    "typical_pods",
]

BEST_FIT_MAX_CPU = 128000
BEST_FIT_MAX_GPU = 8000
ARRIVED_POINTS: tuple[int, ...] = (90, 100, 110, 120, 130)
"""Arrived-workload percentages that are reported (the published table's columns)."""
POLICIES: tuple[str, ...] = ("ours", "best-fit", "fgd")
TIE_EPS = 1e-9
"""Two fragmentation deltas closer than this (GPU units) are a tie for ``ours``."""

_PUBLISHED_NAMES = {"best-fit": "05-BestFit", "fgd": "06-FGD"}


# ------------------------------------------------------------------------------------------------
# Policies. Each returns (node, GPU indices) for a pod and its feasible nodes (non-empty).


def best_fit_raw(
    cpu_free: np.ndarray, idle_milli: np.ndarray, pod_cpu: int, pod_gpu_total: int
) -> np.ndarray:
    """BestFit's raw score, int(100 * (1 - [0.5*cpu_left/128000 + 0.5*gpu_left/8000])).

    Lower leftover is better, so a tight node scores high. Float operations follow the Go order
    so that truncation matches.
    """
    cpu_left = (np.asarray(cpu_free) - pod_cpu) / float(BEST_FIT_MAX_CPU) * 0.5
    gpu_left = (np.asarray(idle_milli) - pod_gpu_total) / float(BEST_FIT_MAX_GPU) * 0.5
    score = (1.0 - (cpu_left + gpu_left)) * 100.0
    return np.trunc(score).astype(np.int64)


def best_fit_normalise(raw: np.ndarray) -> np.ndarray:
    """Min-max to 0..100 with integer arithmetic; all equal gives all 0 (the simulator's rule)."""
    raw = np.asarray(raw, dtype=np.int64)
    lo, hi = int(raw.min()), int(raw.max())
    if hi == lo:
        return np.zeros_like(raw)
    return (raw - lo) * 100 // (hi - lo)


def _pick_by_priority(scores: np.ndarray, priority: np.ndarray) -> int:
    """Index of the highest score; ties go to the smallest priority value (node name prefix)."""
    best = scores == scores.max()
    idx = np.flatnonzero(best)
    return int(idx[np.argmin(priority[idx])])


def _best_gpu(row: np.ndarray, milli: int) -> int:
    """The tightest GPU that fits (least free milli), lowest index on a tie."""
    fit = np.flatnonzero(row >= milli)
    return int(fit[np.argmin(row[fit])])


def best_fit_choose(state: ClusterState, pod: Pod, feasible: np.ndarray) -> tuple[int, list[int]]:
    """The simulator's BestFit: highest normalised score, GPU pick "best"."""
    if len(feasible) == 1:
        node = int(feasible[0])
    else:
        total = pod.milli * pod.gpus if pod.needs_gpu else 0
        raw = best_fit_raw(state.cpu_free[feasible], state.idle[feasible], pod.cpu_nz, total)
        score = best_fit_normalise(raw)
        node = int(feasible[_pick_by_priority(score, state.priority[feasible])])
    return node, _gpus_for(state, node, pod, "best")


def _gpus_for(state: ClusterState, node: int, pod: Pod, how: str) -> list[int]:
    if not pod.needs_gpu:
        return []
    if pod.is_sharing and how == "best":
        return [_best_gpu(state.gpu_free[node], pod.milli)]
    lowest: list[int] = state.lowest_fitting_gpus(node, pod).tolist()
    return lowest


def fgd_int_score(delta_milli: np.ndarray) -> np.ndarray:
    """int(100 * sigmoid((F - F') / 1000)), truncated toward zero, F in milli."""
    x = -np.asarray(delta_milli, dtype=np.float64) / 1000.0
    return np.trunc(1.0 / (1.0 + np.exp(-x)) * 100.0).astype(np.int64)


def fgd_choose(state: ClusterState, pod: Pod, feasible: np.ndarray) -> tuple[int, list[int]]:
    """The paper's FGD with its integer score: highest score, GPU by the same score."""
    cand = state.candidates(pod, feasible, state.metric)
    score = fgd_int_score(cand.delta_milli)
    if pod.is_sharing:
        # Node score = its best GPU's score; among equal scores the lowest GPU index.
        order = np.lexsort((cand.gpu, -score, state.priority[cand.node]))
        # order groups by node priority; find each node's best candidate (first in its group).
        node_sorted = cand.node[order]
        first = np.ones(len(order), dtype=bool)
        first[1:] = node_sorted[1:] != node_sorted[:-1]
        heads = order[first]
        pick = heads[_pick_by_priority(score[heads], state.priority[cand.node[heads]])]
        return int(cand.node[pick]), [int(cand.gpu[pick])]
    pick = _pick_by_priority(score, state.priority[cand.node])
    node = int(cand.node[pick])
    return node, _gpus_for(state, node, pod, "lowest")


def float_choose(state: ClusterState, pod: Pod, feasible: np.ndarray) -> tuple[int, list[int]]:
    """The previous ``ours`` (ablation ``ours-float``): float ΔF with tight-packing tie-breaks.

    F is taken against ``state.demand`` (in :func:`simulate`, :func:`ours_demand`: the typical
    pods plus every multi-GPU shape of the trace). For every feasible placement compute
    dF = F(after) - F(before) in GPU units (float, no sigmoid, no truncation) and take the
    smallest. A sharing pod tries every GPU with enough free milli; on its node the GPU with the
    smallest dF wins, ties (< 1e-9) going to the tightest GPU (least free milli), then the lowest
    index. Whole-GPU pods take the lowest-indexed free GPUs.
    Nodes whose dF are within 1e-9 of the smallest tie; among them the node with the least free
    GPU milli after placement wins, then the least free cpu after placement, then the per-seed
    node priority.
    """
    cand = state.candidates(pod, feasible, state.demand)
    delta = cand.delta_milli / GPU_MILLI  # GPU units
    if pod.is_sharing:
        # Per node: best GPU by (dF within tolerance of the node's minimum, free milli, index).
        starts = np.flatnonzero(np.r_[True, cand.node[1:] != cand.node[:-1]])
        node_min = np.minimum.reduceat(delta, starts)
        group = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, len(delta)]))
        eligible = delta - node_min[group] < TIE_EPS
        heads = starts  # position of the first candidate of each node group
        node_of_group = cand.node[heads]
    else:
        node_min = delta
        node_of_group = cand.node
        heads = np.arange(len(delta))
    tied = np.flatnonzero(node_min - node_min.min() < TIE_EPS)
    order = np.lexsort(
        (
            state.priority[node_of_group[tied]],
            cand.cpu_after[heads[tied]],
            cand.idle_after[heads[tied]],
        )
    )
    g = int(tied[order[0]])
    node = int(node_of_group[g])
    if not pod.is_sharing:
        return node, _gpus_for(state, node, pod, "lowest")
    in_group = np.flatnonzero((group == g) & eligible)
    best = in_group[np.lexsort((cand.gpu[in_group], cand.gpu_free_before[in_group]))[0]]
    return node, [int(cand.gpu[best])]


def ours_choose(
    state: ClusterState,
    pod: Pod,
    feasible: np.ndarray,
    *,
    multi_demand: str = "all",
    ties: str = "used",
    band: int = 0,
    lexical: bool = False,
) -> tuple[int, list[int]]:
    """The pool's placement rule: FGD's quantised score, a fixed node order, and the demand
    that competes for what the pod takes.

    1. **Score** every feasible placement with :func:`fgd_int_score` of its ΔF (FGD's
       ``int(100 * sigmoid(-ΔF / 1000))``; the pool's ``placement.fgd_score``), higher first.
       Placements whose ΔF differ by less than a score step tie.
    2. **Ties go to a node in use, then to a fixed node order**: among equal scores a node with
       a GPU in use beats one whose GPUs are all free (first fit's "open a new bin last"), then
       ``state.priority`` decides (in the pool, the configured node order), so equal
       placements keep landing on the same nodes and the others stay whole.
    3. **Demand**: ΔF is taken against the typical pods *plus every multi-GPU shape of the
       trace* (:func:`ours_demand`): rare by pod count, so the paper's popularity cut drops
       them, but all-or-nothing asks for whole free GPUs on one node. In the pool the demand is
       every offer, weighted by how often it is asked for, so multi-GPU offers are always in.
    4. A sharing pod takes, on its node, the GPU with the best score, then the tightest, then
       the lowest index (the pool's order of a node's options).

    ``multi_demand`` ("all", "multi": multi-GPU pods only, "none": which pods score against
    :func:`ours_demand` rather than the typical pods) and
    ``ties`` ("used": the rule; "order": the node order only; "tightest": least idle GPU, then
    least cpu, then order; "small-node", "whole-free", "used-small"), ``band`` (scores within
    that many steps of the best tie) and ``lexical`` (the paper's measure scores, the demand's
    score breaks its ties) exist for the ablation variants of :data:`ALL_POLICIES`.
    """
    uses_demand = multi_demand == "all" or (multi_demand == "multi" and pod.gpus >= 2)
    if lexical:  # the paper's measure first, the demand's score breaks its ties
        cand = state.candidates(pod, feasible, state.metric)
        second = fgd_int_score(state.candidates(pod, feasible, state.demand).delta_milli)
    else:
        cand = state.candidates(pod, feasible, state.demand if uses_demand else state.metric)
    score = fgd_int_score(cand.delta_milli)
    if band:  # scores within ``band`` steps of the best tie with it
        score = np.minimum(score, score.max() - band)
    prio = state.priority[cand.node]
    fresh = state.idle[cand.node] == state.nodes.gpus[cand.node] * GPU_MILLI  # all GPUs free
    keys: list[np.ndarray] = [cand.gpu, cand.gpu_free_before]  # within a node (last keys first)
    if ties == "tightest":
        keys += [prio, cand.cpu_after, cand.idle_after]
    elif ties == "small-node":  # the node with the fewest GPUs first: big nodes stay whole
        keys += [prio, state.nodes.gpus[cand.node]]
    elif ties == "whole-free":  # do not break a whole GPU, then the node with fewest whole ones
        whole = (state.gpu_free[cand.node] == GPU_MILLI).sum(axis=1)
        broke = (cand.gpu_free_before == GPU_MILLI).astype(np.int64)
        keys += [prio, whole, broke]
    elif ties == "used-small":  # in use first, then the node with the fewest GPUs
        keys += [prio, state.nodes.gpus[cand.node], fresh]
    elif ties == "used":  # a node with a GPU in use before one whose GPUs are all free
        keys += [prio, fresh]
    else:
        keys += [prio]
    if lexical:
        keys.append(-second)
    best = int(np.lexsort((*keys, -score))[0])
    node = int(cand.node[best])
    if pod.is_sharing:
        return node, [int(cand.gpu[best])]
    return node, _gpus_for(state, node, pod, "lowest")


#: A placement policy: (node, GPU indices) for a pod among the feasible nodes.
Chooser = Callable[[ClusterState, Pod, np.ndarray], tuple[int, list[int]]]

_CHOOSERS: dict[str, Chooser] = {
    "best-fit": best_fit_choose,
    "fgd": fgd_choose,
    "ours": ours_choose,
    # Ablation variants (docs: the packing benchmark), each ``ours`` with one ingredient changed:
    "ours-float": float_choose,  # the previous rule: float ΔF, tightest-node ties
    "ours-tightest-ties": partial(ours_choose, ties="tightest"),
    "ours-no-multi": partial(ours_choose, multi_demand="none"),
    "ours-multi-pods-only": partial(ours_choose, multi_demand="multi"),
    "ours-order-ties": partial(ours_choose, ties="order"),  # the rule before "in use first"
    # Explored on the previous rule (node-order ties); see the docs for the figures:
    "ours-order-band1": partial(ours_choose, ties="order", band=1),
    "ours-order-small-node": partial(ours_choose, ties="small-node"),
    "ours-order-whole-free": partial(ours_choose, ties="whole-free"),
    "ours-order-lexical": partial(ours_choose, ties="order", lexical=True),
    "ours-order-multi-by-gpus": partial(ours_choose, ties="order"),  # D: added x GPU count
    "ours-used-small-ties": partial(ours_choose, ties="used-small"),
}
ALL_POLICIES: tuple[str, ...] = tuple(_CHOOSERS)
_USES_DEMAND = {p for p in _CHOOSERS if p.startswith("ours") and p != "ours-no-multi"}
_DEMAND_WEIGHT = {"ours-order-multi-by-gpus": "gpus"}


# ------------------------------------------------------------------------------------------------
# Simulation and metrics


@dataclass
class SimResult:
    """One (trace, seed, policy) run: per arrived-% bin, mean allocation % and fragmentation %."""

    trace: str
    seed: int
    policy: str
    bins: dict[int, dict[str, float]]
    n_pods: int
    n_failed: int
    failed_gpu_milli: int
    first_failure_arrived_pct: float | None
    failures_before_90: dict[str, int] = field(default_factory=dict)
    wall_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "policy": self.policy,
            "bins": {
                str(k): {key: None if math.isnan(x) else x for key, x in v.items()}
                for k, v in self.bins.items()
            },
            "n_pods": self.n_pods,
            "n_failed": self.n_failed,
            "failed_gpu_milli": self.failed_gpu_milli,
            "first_failure_arrived_pct": self.first_failure_arrived_pct,
            "failures_before_90": self.failures_before_90,
            "wall_s": round(self.wall_s, 2),
        }


def bin_samples(
    arrived_milli: np.ndarray,
    used_milli: np.ndarray,
    frag_milli: np.ndarray,
    total_gpus: int,
    points: Iterable[int] = ARRIVED_POINTS,
) -> dict[int, dict[str, float]]:
    """Per-event samples to the paper's discrete curves.

    Each sample's arrived % is rounded half-to-even to an integer; column k is the mean of the
    samples in bin k (allocation % per sample rounded to 2 decimals first; fragmentation as % of
    total GPU capacity), or of bins k-1..k+1 when bin k is empty; NaN when those are empty too.
    """
    capacity = float(total_gpus * GPU_MILLI)
    arrived = np.round(np.asarray(arrived_milli, dtype=np.float64) / capacity * 100).astype(
        np.int64
    )
    alloc = np.round(np.asarray(used_milli, dtype=np.float64) / capacity * 100, 2)
    frag = np.asarray(frag_milli, dtype=np.float64)
    out: dict[int, dict[str, float]] = {}
    for k in points:
        sel = arrived == k
        if not sel.any():
            sel = (arrived >= k - 1) & (arrived <= k + 1)
        if not sel.any():
            out[k] = {"alloc_pct": math.nan, "frag_pct": math.nan}
            continue
        out[k] = {
            "alloc_pct": round(float(alloc[sel].mean()), 2),
            "frag_pct": round(100 * float(frag[sel].mean()) / GPU_MILLI / total_gpus, 2),
        }
    return out


def _pod_class(pod: Pod) -> str:
    if not pod.needs_gpu:
        return "cpu-only"
    if pod.is_sharing:
        return "sharing"
    return f"{pod.gpus}-gpu"


def simulate(
    trace: PodTable,
    nodes: NodeTable,
    seed: int,
    policy: str,
    *,
    tune: float = 1.3,
    typical: TypicalPods | None = None,
    points: Iterable[int] = ARRIVED_POINTS,
) -> SimResult:
    """Run one seed of the experiment with one policy and return the binned curves.

    The seed drives, in order: the shuffle of the originals, the clone draws, and the node
    priority permutation used for tie-breaks, so every policy sees the same arrivals for a seed.
    ``typical`` overrides the fragmentation measure's task distribution (default: the trace's
    typical pods). ``policy`` is one of :data:`ALL_POLICIES` (:data:`POLICIES` and the ablation
    variants).
    """
    if policy not in _CHOOSERS:
        raise ValueError(f"unknown policy {policy!r} (choose from {', '.join(ALL_POLICIES)})")
    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    order = tune_workload(trace, nodes.capacity_milli, tune, rng)
    priority = rng.permutation(len(nodes))
    typical = typical_pods(trace) if typical is None else typical
    weight = _DEMAND_WEIGHT.get(policy, "count")
    demand = ours_demand(trace, weight=weight) if policy in _USES_DEMAND else None
    state = ClusterState(nodes, typical, priority, demand=demand)
    choose = _CHOOSERS[policy]

    n = len(order)
    arrived = np.zeros(n, dtype=np.int64)
    used = np.zeros(n, dtype=np.int64)
    frag = np.zeros(n, dtype=np.float64)
    arrived_total = 0
    n_failed = 0
    failed_milli = 0
    first_failure: float | None = None
    early: Counter[str] = Counter()
    capacity = float(nodes.capacity_milli)

    cpu, cpu_nz, mem = trace.cpu.tolist(), trace.cpu_nonzero.tolist(), trace.memory.tolist()
    gpus, milli, spec = trace.num_gpu.tolist(), trace.gpu_milli.tolist(), trace.spec
    for i, p in enumerate(order.tolist()):
        pod = Pod(cpu[p], cpu_nz[p], mem[p], gpus[p], milli[p], spec[p])
        total = pod.milli * pod.gpus if pod.needs_gpu else 0
        arrived_total += total
        feasible = state.feasible(pod)
        if len(feasible):
            node, gpu_ids = choose(state, pod, feasible)
            state.place(node, gpu_ids, pod)
        else:
            n_failed += 1
            failed_milli += total
            pct = arrived_total / capacity * 100
            if first_failure is None:
                first_failure = round(pct, 3)
            if pct < 89.5:
                early[_pod_class(pod)] += 1
        arrived[i] = arrived_total
        used[i] = state.used_milli
        frag[i] = state.frag_milli()
    return SimResult(
        trace=trace.name,
        seed=int(seed),
        policy=policy,
        bins=bin_samples(arrived, used, frag, nodes.total_gpus, points),
        n_pods=n,
        n_failed=n_failed,
        failed_gpu_milli=failed_milli,
        first_failure_arrived_pct=first_failure,
        failures_before_90=dict(early),
        wall_s=time.perf_counter() - started,
    )


# ------------------------------------------------------------------------------------------------
# Experiment driver


def _run_one(task: tuple[PodTable, NodeTable, int, str, float]) -> SimResult:
    trace, nodes, seed, policy, tune = task
    return simulate(trace, nodes, seed, policy, tune=tune)


def run_experiment(
    trace: PodTable,
    nodes: NodeTable,
    seeds: Sequence[int],
    policies: Sequence[str],
    *,
    tune: float = 1.3,
    workers: int = 1,
) -> dict[str, list[SimResult]]:
    """All (seed, policy) runs, in a process pool when ``workers > 1``; results per policy."""
    tasks = [(trace, nodes, s, p, tune) for p in policies for s in seeds]
    if workers <= 1 or len(tasks) <= 1:
        results = [_run_one(t) for t in tasks]
    else:
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            results = list(pool.map(_run_one, tasks))
    out: dict[str, list[SimResult]] = {p: [] for p in policies}
    for r in results:
        out[r.policy].append(r)
    return out


def mean_bins(
    results: Sequence[SimResult], points: Iterable[int] = ARRIVED_POINTS
) -> dict[str, dict[str, float | None]]:
    """Mean over seeds of each bin's allocation % and fragmentation % (None if a seed lacks it)."""
    out: dict[str, dict[str, float | None]] = {}
    for k in points:
        cell: dict[str, float | None] = {}
        for key in ("alloc_pct", "frag_pct"):
            values = [r.bins[k][key] for r in results]
            cell[key] = None if any(math.isnan(v) for v in values) else round(mean(values), 4)
        out[str(k)] = cell
    return out


def load_published(summary_csv: str | Path, trace: str) -> dict[str, dict[str, dict[str, float]]]:
    """Published per-seed means for ``trace`` from fgd_expected_summary.csv, keyed like our JSON.

    Returns ``{"best-fit": {"90": {"alloc_pct", "frag_pct"}, ...}, "fgd": {...}}``; empty when
    the trace is not in the file.
    """
    wanted = {v: k for k, v in _PUBLISHED_NAMES.items()}
    out: dict[str, dict[str, dict[str, float]]] = {}
    with open(summary_csv, newline="") as f:
        for row in csv.DictReader(f):
            if row["workload"] != trace or row["policy"] not in wanted:
                continue
            out.setdefault(wanted[row["policy"]], {})[str(int(row["arrived_pct"]))] = {
                "alloc_pct": float(row["alloc_pct_mean"]),
                "frag_pct": float(row["frag_pct_mean"]),
            }
    return out


def find_published(pods_csv: str | Path) -> Path | None:
    """``fgd_expected_summary.csv`` next to the trace's folder, if there is one."""
    candidate = Path(pods_csv).resolve().parent.parent / "fgd_expected_summary.csv"
    return candidate if candidate.is_file() else None


def _cell(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.3f}"


def format_table(
    policy: str,
    means: dict[str, dict[str, float | None]],
    published: dict[str, dict[str, dict[str, float]]],
) -> str:
    """A plain-text table: arrived % -> alloc %, frag % (and the published means, if known)."""
    head = f"{'arrived %':>9}  {'alloc %':>8}  {'frag %':>7}"
    if published:
        head += f"  {'BestFit alloc':>13}  {'frag':>6}  {'FGD alloc':>9}  {'frag':>6}"
    lines = [f"policy: {policy}", head, "-" * len(head)]
    for k, v in means.items():
        line = f"{k:>9}  {_cell(v['alloc_pct'], 8)}  {_cell(v['frag_pct'], 7)}"
        if published:
            bf = published.get("best-fit", {}).get(k, {})
            fg = published.get("fgd", {}).get(k, {})
            line += f"  {_cell(bf.get('alloc_pct'), 13)}  {_cell(bf.get('frag_pct'), 6)}"
            line += f"  {_cell(fg.get('alloc_pct'), 9)}  {_cell(fg.get('frag_pct'), 6)}"
        lines.append(line)
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# Command line


class _UsageError(ValueError, argparse.ArgumentTypeError):
    """A bad flag value: a ValueError for callers, a clean one-line usage error for argparse."""


def parse_seeds(text: str) -> list[int]:
    """``"42-51"`` (inclusive range), ``"42,43,50"`` (list) or ``"7"`` to a list of seeds."""
    raw = str(text).strip()
    if not raw:
        raise _UsageError("empty; give a range like 42-51, a list like 42,43 or one seed")
    try:
        if "," in raw:
            seeds = [int(part) for part in raw.split(",")]
        elif "-" in raw.lstrip("-"):
            lo_text, hi_text = raw.split("-", 1)
            lo, hi = int(lo_text), int(hi_text)
            if hi < lo:
                raise _UsageError(f"range {raw!r} runs backwards (write {hi}-{lo})")
            seeds = list(range(lo, hi + 1))
        else:
            seeds = [int(raw)]
    except _UsageError:
        raise
    except ValueError:
        raise _UsageError(
            f"{raw!r} is not a range like 42-51, a list like 42,43 or one seed"
        ) from None
    if any(s < 0 for s in seeds):
        raise _UsageError(f"seeds must be non-negative integers, got {raw!r}")
    if len(set(seeds)) != len(seeds):
        raise _UsageError(f"{raw!r} repeats a seed")
    return seeds


def parse_policies(text: str) -> list[str]:
    """Comma list of policies, each one of ``ours``, ``best-fit``, ``fgd``."""
    names = [p.strip() for p in str(text).split(",") if p.strip()]
    if not names:
        raise _UsageError(f"empty; choose from {', '.join(POLICIES)}")
    bad = [p for p in names if p not in ALL_POLICIES]
    if bad:
        raise _UsageError(f"unknown {', '.join(bad)}; choose from {', '.join(POLICIES)}")
    return list(dict.fromkeys(names))


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise _UsageError(f"{text!r} is not a number") from None
    if not value > 0 or math.isinf(value):
        raise _UsageError(f"must be a positive number, got {text!r}")
    return value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise _UsageError(f"{text!r} is not an integer") from None
    if value < 1:
        raise _UsageError(f"must be at least 1, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Flags of ``jupyterhub-gpupool simulate packing``."""
    parser.add_argument("--pods", required=True, metavar="CSV", help="pod list (openb_pod_list_*)")
    parser.add_argument(
        "--nodes", required=True, metavar="CSV", help="node list (openb_node_list_gpu_node.csv)"
    )
    parser.add_argument(
        "--seeds",
        type=parse_seeds,
        default=parse_seeds("42-51"),
        metavar="SEEDS",
        help="a range (42-51), a list (42,43,50) or one seed; default 42-51",
    )
    parser.add_argument("--json", metavar="OUT", help="also write the results as JSON here")
    parser.add_argument(
        "--policies",
        type=parse_policies,
        default=parse_policies("ours,best-fit"),
        metavar="LIST",
        help=f"comma list from {', '.join(POLICIES)}; default ours,best-fit",
    )
    parser.add_argument(
        "--tune",
        type=_positive_float,
        default=1.3,
        help="workload tuned to this multiple of GPU capacity; default 1.3",
    )
    parser.add_argument(
        "--workers",
        type=_positive_int,
        default=2,
        help="processes running seeds in parallel; default 2",
    )


def run_experiment_report(
    pods_csv: str | Path,
    nodes_csv: str | Path,
    seeds: Sequence[int],
    policies: Sequence[str],
    *,
    tune: float = 1.3,
    workers: int = 1,
) -> dict[str, Any]:
    """Run the experiment and build the JSON report (means, per-seed values, published means)."""
    trace = load_pods(pods_csv)
    nodes = load_nodes(nodes_csv)
    check_models(trace, nodes)
    started = time.perf_counter()
    runs = run_experiment(trace, nodes, seeds, policies, tune=tune, workers=workers)
    wall = time.perf_counter() - started
    summary = find_published(pods_csv)
    published = load_published(summary, trace.name) if summary else {}
    return {
        "trace": trace.name,
        "seeds": list(seeds),
        "policies": {p: mean_bins(runs[p]) for p in policies},
        "tune": tune,
        "wall_s": round(wall, 1),
        "published": published,
        "per_seed": {p: [r.to_json() for r in runs[p]] for p in policies},
    }


def _seeds_text(seeds: Sequence[int]) -> str:
    if len(seeds) > 2 and list(seeds) == list(range(seeds[0], seeds[-1] + 1)):
        return f"{seeds[0]}-{seeds[-1]}"
    return ",".join(str(s) for s in seeds)


def run_cli(args: argparse.Namespace) -> int:
    """Run the experiment, print one table per policy, and write JSON if ``--json`` is given."""
    # Flags arrive parsed from add_arguments; accept the raw text too (e.g. a hand-made Namespace).
    seeds = parse_seeds(args.seeds) if isinstance(args.seeds, str) else list(args.seeds)
    policies = (
        parse_policies(args.policies) if isinstance(args.policies, str) else list(args.policies)
    )
    report = run_experiment_report(
        args.pods,
        args.nodes,
        seeds,
        policies,
        tune=float(args.tune),
        workers=int(args.workers),
    )
    print(
        f"trace {report['trace']}: seeds {_seeds_text(seeds)} ({len(seeds)}), "
        f"tune {report['tune']}, {report['wall_s']} s"
    )
    for policy, means in report["policies"].items():
        print()
        print(format_table(policy, means, report["published"]))
        fails = [r["n_failed"] for r in report["per_seed"][policy]]
        print(
            f"failed pods per seed: mean {np.mean(fails):.1f}, min {min(fails)}, max {max(fails)}"
        )
    if not report["published"]:
        print("\n(no published figures for this trace)")
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nwrote {out}", file=sys.stderr)
    return 0

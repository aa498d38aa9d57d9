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
* ``ours``: the pool's fragmentation-aware placement (float fragmentation delta, tightest-packing
  tie-breaks); see :func:`ours_choose`.

Everything that the paper's Go code draws from its global RNG (shuffle, clones, node priority
order) is drawn here from ``numpy.random.default_rng(seed)``, so per-seed numbers differ from the
published ones; only the distribution over seeds is comparable.
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
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from statistics import fmean as mean

import numpy as np

from .traces import (
    DEFAULT_CPU_REQUEST,
    GPU_MILLI,
    NodeTable,
    PodTable,
    TraceError,
    check_models,
    load_nodes,
    load_pods,
)
from .traces import clean_spec as _clean_spec
from .traces import spec_models as _spec_models

__all__ = [
    "ALL_POLICIES",
    "ARRIVED_POINTS",
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

MAX_PODS_PER_NODE = 1001
"""The simulator's per-node pod limit (Kubernetes ``pods`` allocatable)."""
BEST_FIT_MAX_CPU = 128000
BEST_FIT_MAX_GPU = 8000
ARRIVED_POINTS: tuple[int, ...] = (90, 100, 110, 120, 130)
"""Arrived-workload percentages that are reported (the published table's columns)."""
POLICIES: tuple[str, ...] = ("ours", "best-fit", "fgd")
TIE_EPS = 1e-9
"""Two fragmentation deltas closer than this (GPU units) are a tie for ``ours``."""

_PUBLISHED_NAMES = {"best-fit": "05-BestFit", "fgd": "06-FGD"}


# ------------------------------------------------------------------------------------------------
# Workload tuning


def tune_workload(
    pods: PodTable, capacity_milli: int, ratio: float, rng: np.random.Generator
) -> np.ndarray:
    """Arrival order (indices into ``pods``) after the simulator's workload tuning.

    The originals arrive in a seeded random order. If their total GPU milli is below
    ``ratio * capacity`` (tune up), clones drawn uniformly with replacement from the name-sorted
    originals are appended, not reshuffled, until the first draw whose *per-GPU* milli would push
    the running total above the target; that draw is not added. A final multi-GPU clone may thus
    overshoot by up to ``(count - 1) * milli``, after which any draw, even a CPU-only one, stops.
    Above the target (tune down), pods at uniformly random positions are removed until the total
    is within it; survivors keep their order.
    """
    n = len(pods)
    order = rng.permutation(n)
    total = int(pods.total_milli.sum())
    target = float(ratio) * float(capacity_milli)
    if ratio <= 0 or float(total) == target:
        return order
    if float(total) < target:
        per_gpu = pods.gpu_milli
        per_pod = pods.total_milli
        clones: list[int] = []
        while True:
            for idx in rng.integers(0, n, size=1024):
                if float(total + int(per_gpu[idx])) > target:
                    return np.concatenate([order, np.asarray(clones, dtype=np.int64)])
                total += int(per_pod[idx])
                clones.append(int(idx))
    # Tune down: removing a uniformly random survivor each time is the same as removing pods in
    # the order of a random permutation of positions.
    keep = np.ones(n, dtype=bool)
    per_pod_in_order = pods.total_milli[order]
    for pos in rng.permutation(n):
        if float(total) <= target:
            break
        keep[pos] = False
        total -= int(per_pod_in_order[pos])
    return order[keep]


# ------------------------------------------------------------------------------------------------
# Typical pods and the fragmentation measure


@dataclass(frozen=True)
class TypicalPods:
    """The target workload the fragmentation measure is taken against.

    One entry per kept resource tuple, in selection order: non-zero cpu, per-GPU milli, GPU count,
    GPU-model spec, and the number of original pods with that tuple (``count``; the probability
    is ``count / count.sum()``).
    """

    cpu: np.ndarray
    milli: np.ndarray
    gpus: np.ndarray
    spec: tuple[str, ...]
    count: np.ndarray
    n_tuples: int = 0  # distinct tuples in the trace, before the cut

    @property
    def prob(self) -> np.ndarray:
        return self.count / self.count.sum()

    def __len__(self) -> int:
        return len(self.spec)


def _shape_counts(pods: PodTable) -> Counter[tuple[int, int, int, str]]:
    """Pods per resource tuple (non-zero cpu, per-GPU milli, GPU count, spec); memory is ignored."""
    return Counter(
        zip(
            pods.cpu_nonzero.tolist(),
            pods.gpu_milli.tolist(),
            pods.num_gpu.tolist(),
            pods.spec,
            strict=True,
        )
    )


def typical_pods(pods: PodTable, threshold_pct: float = 95.0) -> TypicalPods:
    """The most frequent resource tuples of the original trace covering ``threshold_pct`` of pods.

    CPU-only pods are included. Tuples are ranked by count (descending), ties going to the larger
    tuple (cpu, then milli, then count, then spec), and taken until the cumulative count reaches
    the threshold. Memory is not part of the tuple, as in the simulator.
    """
    counts = _shape_counts(pods)
    ranked = sorted(counts.items(), key=lambda kv: (kv[1], *kv[0]), reverse=True)
    total = sum(counts.values())
    expected = threshold_pct * total / 100.0
    kept: list[tuple[tuple[int, int, int, str], int]] = []
    cum = 0
    for item in ranked:
        if cum >= expected:
            break
        kept.append(item)
        cum += item[1]
    return TypicalPods(
        cpu=np.array([k[0] for k, _ in kept], dtype=np.int64),
        milli=np.array([k[1] for k, _ in kept], dtype=np.int64),
        gpus=np.array([k[2] for k, _ in kept], dtype=np.int64),
        spec=tuple(k[3] for k, _ in kept),
        count=np.array([c for _, c in kept], dtype=np.int64),
        n_tuples=len(counts),
    )


def ours_demand(pods: PodTable, threshold_pct: float = 95.0) -> TypicalPods:
    """The task distribution ``ours`` scores against: the typical pods plus every multi-GPU shape.

    The paper's cut keeps the most *popular* shapes covering 95% of pods. Multi-GPU asks are
    rare by pod count (about 1% of the default trace, so none survives the cut) but large in GPU
    demand, and all-or-nothing: one fails unless a single node has k fully free GPUs. Without
    them in the distribution the measure puts no value on keeping a node's GPUs together, and a
    float-precise minimiser happily breaks every 8-GPU node. So every shape with two or more GPUs
    that appears in the trace is kept, at its observed count (p_t = count_t / sum of counts),
    appended after the typical shapes.
    """
    base = typical_pods(pods, threshold_pct)
    kept = set(
        zip(base.cpu.tolist(), base.milli.tolist(), base.gpus.tolist(), base.spec, strict=True)
    )
    counts = _shape_counts(pods)
    extra = sorted(
        ((k, c) for k, c in counts.items() if k[2] >= 2 and k[1] > 0 and k not in kept),
        key=lambda kv: (kv[1], *kv[0]),
        reverse=True,
    )
    return TypicalPods(
        cpu=np.r_[base.cpu, [k[0] for k, _ in extra]].astype(np.int64),
        milli=np.r_[base.milli, [k[1] for k, _ in extra]].astype(np.int64),
        gpus=np.r_[base.gpus, [k[2] for k, _ in extra]].astype(np.int64),
        spec=base.spec + tuple(k[3] for k, _ in extra),
        count=np.r_[base.count, [c for _, c in extra]].astype(np.int64),
        n_tuples=base.n_tuples,
    )


def model_access(spec: str, node_models: Sequence[str]) -> np.ndarray:
    """Which nodes a GPU-model spec accepts ("" or only empty parts: every node)."""
    models = _spec_models(spec)
    if not models:
        return np.ones(len(node_models), dtype=bool)
    return np.array([m in models for m in node_models], dtype=bool)


def _gpu_matrix(nodes: NodeTable) -> np.ndarray:
    """nodes x max-GPUs array of free milli; padding columns are 0 (never fit, never fragment)."""
    width = max(1, int(nodes.gpus.max()))
    cols = np.arange(width)
    return np.where(cols[None, :] < nodes.gpus[:, None], GPU_MILLI, 0).astype(np.int64)


def task_access(typical: TypicalPods, node_models: Sequence[str]) -> np.ndarray:
    """nodes x tasks: whether each typical task's GPU-model spec accepts each node."""
    if not typical.spec:
        return np.ones((len(node_models), 0), dtype=bool)
    return np.stack([model_access(s, node_models) for s in typical.spec], axis=1)


def _per_task_fragment(
    gpu_free: np.ndarray, cpu_free: np.ndarray, access: np.ndarray | None, typical: TypicalPods
) -> np.ndarray:
    """f_t(node) in milli for every node (rows) and typical task (columns)."""
    gpu_free = np.atleast_2d(np.asarray(gpu_free, dtype=np.int64))
    cpu_free = np.atleast_1d(np.asarray(cpu_free, dtype=np.int64))
    if access is None:
        access = np.ones((len(gpu_free), len(typical)), dtype=bool)
    idle = gpu_free.sum(axis=1)  # L
    milli = typical.milli[None, :, None]
    big_enough = gpu_free[:, None, :] >= milli  # node x task x GPU
    n_fit = big_enough.sum(axis=2)
    too_small = np.where(big_enough, 0, gpu_free[:, None, :]).sum(axis=2)
    q3 = (
        (typical.milli[None, :] > 0)
        & access
        & (n_fit >= typical.gpus[None, :])
        & (cpu_free[:, None] >= typical.cpu[None, :])
    )
    return np.where(q3, too_small, idle[:, None])


def node_fragmentation(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    access: np.ndarray | None,
    typical: TypicalPods,
) -> np.ndarray:
    """FGD fragmentation F(node) = sum_t p_t * f_t(node), in milli-GPU, for each node.

    ``gpu_free`` is nodes x GPUs (free milli, 0 for absent GPUs), ``cpu_free`` the free milli-cpu,
    ``access[n, t]`` whether task t's GPU-model spec accepts node n (None: all do; see
    :func:`task_access`). f_t is the node's whole idle
    GPU milli, except when t needs GPUs, may use the node, finds ``gpus_t`` GPUs with at least
    ``milli_t`` free and enough cpu (the paper's Q3): then only the idle milli on GPUs too small
    for t counts. Memory plays no part, as in the paper.
    """
    frag = _per_task_fragment(gpu_free, cpu_free, access, typical)
    return frag @ typical.count / float(typical.count.sum())


def ours_node_fragmentation(
    gpu_free: np.ndarray,
    cpu_free: np.ndarray,
    access: np.ndarray | None,
    typical: TypicalPods,
) -> np.ndarray:
    """The pool's F(node) in GPU units (free milli / 1000): what ``ours`` minimises the growth of.

    Same per-task fragment as :func:`node_fragmentation`, expressed in GPUs so that the pool's
    scalar implementation (which counts GPU units) can be cross-checked against this one.
    """
    return node_fragmentation(gpu_free, cpu_free, access, typical) / GPU_MILLI


# ------------------------------------------------------------------------------------------------
# Cluster state


@dataclass(frozen=True)
class Pod:
    """One pod as the scheduler sees it; build it with :meth:`make`."""

    cpu: int  # milli-cpu request (feasibility and state)
    cpu_nz: int  # the "non-zero" request the scores and fragmentation use (0 -> 100)
    memory: int  # MiB
    gpus: int
    milli: int  # per-GPU milli, 0..1000
    spec: str = ""

    @classmethod
    def make(cls, cpu: int, memory: int = 0, gpus: int = 0, milli: int = 0, spec: str = "") -> Pod:
        """Apply the trace's rules: GPU fields only with gpus > 0, milli clamped to 0..1000."""
        milli = min(max(int(milli), 0), GPU_MILLI) if gpus else 0
        nz = cpu if cpu else DEFAULT_CPU_REQUEST
        return cls(int(cpu), int(nz), int(memory), int(gpus), milli, _clean_spec(spec))

    @property
    def is_sharing(self) -> bool:
        return self.gpus == 1 and 0 < self.milli < GPU_MILLI

    @property
    def needs_gpu(self) -> bool:
        return self.milli > 0 and self.gpus > 0


class _FragModel:
    """F(node) for every node against one task distribution, cached and updated incrementally.

    Per node and distinct task milli m we keep the number of GPUs with at least m free and the
    idle milli on GPUs with less than m free; F(node) follows from those in O(tasks), so a
    hypothetical placement costs O(candidates x tasks) and a real one only refreshes its node.
    F is held as the integer weighted sum sum_t count_t * f_t (exact in a float64), so the
    cluster total is a running sum without drift.
    """

    def __init__(
        self,
        typical: TypicalPods,
        models: Sequence[str],
        gpu_free: np.ndarray,
        idle: np.ndarray,
        cpu_free: np.ndarray,
    ) -> None:
        self.typical = typical
        gpu_tasks = typical.milli > 0
        self.weight_total = int(typical.count.sum())
        if self.weight_total <= 0:
            raise ValueError("the task distribution is empty")
        self.milli_values = np.unique(typical.milli[gpu_tasks])  # distinct m, sorted
        self.midx = np.searchsorted(self.milli_values, typical.milli[gpu_tasks])
        self.gpus = typical.gpus[gpu_tasks]
        self.cpu = typical.cpu[gpu_tasks]
        self.weight = typical.count[gpu_tasks].astype(np.float64)
        specs = [s for s, g in zip(typical.spec, gpu_tasks, strict=True) if g]
        self.access: np.ndarray | None = None  # None: every task may use every node
        if any(_spec_models(s) for s in specs):
            self.access = np.stack([model_access(s, models) for s in specs], axis=1)
        self.n_ge, self.small_idle = self.profile(gpu_free)
        self.frag_w = self.weighted(self.n_ge, self.small_idle, idle, cpu_free, self.access)
        self.frag_w_total = float(self.frag_w.sum())

    def profile(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per row and distinct task milli m: #GPUs with free >= m, idle milli on GPUs < m."""
        ge = rows[:, None, :] >= self.milli_values[None, :, None]
        return ge.sum(axis=2), np.where(ge, 0, rows[:, None, :]).sum(axis=2)

    def weighted(
        self,
        n_ge: np.ndarray,
        small_idle: np.ndarray,
        idle: np.ndarray,
        cpu_free: np.ndarray,
        access: np.ndarray | None,
    ) -> np.ndarray:
        """sum_t count_t * f_t per row: all idle counts, minus what Q3 tasks leave usable."""
        q3 = (n_ge[:, self.midx] >= self.gpus) & (cpu_free[:, None] >= self.cpu)
        if access is not None:
            q3 &= access
        saved = (idle[:, None] - small_idle[:, self.midx]) * q3
        return idle * float(self.weight_total) - saved.astype(np.float64) @ self.weight

    def access_rows(self, rows: np.ndarray) -> np.ndarray | None:
        return None if self.access is None else self.access[rows]

    def refresh(self, node: int, gpu_row: np.ndarray, idle: int, cpu_free: int) -> None:
        """Recompute one node after a real placement and update the cluster total."""
        n_ge, small = self.profile(gpu_row[None, :])
        self.n_ge[node], self.small_idle[node] = n_ge[0], small[0]
        rows = np.array([node])
        new = self.weighted(
            n_ge, small, np.array([idle]), np.array([cpu_free]), self.access_rows(rows)
        )[0]
        self.frag_w_total += new - self.frag_w[node]
        self.frag_w[node] = new

    def delta(
        self,
        node: np.ndarray,
        change: tuple[np.ndarray, np.ndarray, int] | np.ndarray | None,
        idle_after: np.ndarray,
        cpu_after: np.ndarray,
    ) -> np.ndarray:
        """Weighted F(after) - F(before) for hypothetical placements on ``node`` (one per entry).

        ``change`` describes the GPUs: None (CPU-only), ``(before, after, k)`` (k GPUs per
        candidate go from ``before`` to ``after`` free milli), or a full after-state GPU matrix.
        """
        if change is None:
            n_ge, small = self.n_ge[node], self.small_idle[node]
        elif isinstance(change, tuple):
            before, after, k = change
            m = self.milli_values[None, :]
            b, a = before[:, None], after[:, None]
            n_ge = self.n_ge[node] + k * ((a >= m).astype(np.int64) - (b >= m))
            small = self.small_idle[node] + k * (np.where(a < m, a, 0) - np.where(b < m, b, 0))
        else:
            n_ge, small = self.profile(change)
        after = self.weighted(n_ge, small, idle_after, cpu_after, self.access_rows(node))
        return after - self.frag_w[node]


class ClusterState:
    """Free resources of every node as numpy arrays (nodes x GPUs for GPU milli).

    ``metric`` is the paper's fragmentation measure (the reported frag %, and FGD's score);
    ``demand`` is the task distribution ``ours`` scores against (the same object unless given).
    """

    def __init__(
        self,
        nodes: NodeTable,
        typical: TypicalPods,
        priority: np.ndarray | None = None,
        demand: TypicalPods | None = None,
    ) -> None:
        self.nodes = nodes
        n = len(nodes)
        self.priority = (
            np.arange(n, dtype=np.int64) if priority is None else np.asarray(priority, np.int64)
        )
        self.gpu_free = _gpu_matrix(nodes)
        self.cpu_free = nodes.cpu.copy()
        self.mem_free = nodes.memory.copy()
        self.n_pods = np.zeros(n, dtype=np.int64)
        self.idle = self.gpu_free.sum(axis=1)
        self.used_milli = 0
        self._access_cache: dict[str, np.ndarray] = {}
        args = (nodes.model, self.gpu_free, self.idle, self.cpu_free)
        self.metric = _FragModel(typical, *args)
        self.demand = self.metric if demand is None else _FragModel(demand, *args)

    def frag_milli(self) -> float:
        """Cluster fragmentation (the paper's measure), sum of F(node), in milli-GPU."""
        return self.metric.frag_w_total / self.metric.weight_total

    def node_frag_milli(self) -> np.ndarray:
        return self.metric.frag_w / self.metric.weight_total

    # -- feasibility and placement --------------------------------------------------------------
    def model_mask(self, spec: str) -> np.ndarray | None:
        if not _spec_models(spec):
            return None
        mask = self._access_cache.get(spec)
        if mask is None:
            mask = model_access(spec, self.nodes.model)
            self._access_cache[spec] = mask
        return mask

    def feasible(self, pod: Pod) -> np.ndarray:
        """Indices of nodes that pass cpu, memory, pod-count and (GPU pods) GPU checks."""
        ok = (
            (self.cpu_free >= pod.cpu)
            & (self.mem_free >= pod.memory)
            & (self.n_pods + 1 <= MAX_PODS_PER_NODE)
        )
        if pod.needs_gpu:
            ok &= (self.gpu_free >= pod.milli).sum(axis=1) >= pod.gpus
            mask = self.model_mask(pod.spec)
            if mask is not None:
                ok &= mask
        return np.flatnonzero(ok)

    def lowest_fitting_gpus(self, node: int, pod: Pod) -> np.ndarray:
        """The ``pod.gpus`` lowest-indexed GPUs of ``node`` with at least ``pod.milli`` free."""
        return np.flatnonzero(self.gpu_free[node] >= pod.milli)[: pod.gpus]

    def place(self, node: int, gpus: Iterable[int], pod: Pod) -> None:
        """Commit a placement and refresh the node's cached fragmentation."""
        gpus = list(gpus)
        self.cpu_free[node] -= pod.cpu
        self.mem_free[node] -= pod.memory
        self.n_pods[node] += 1
        if pod.needs_gpu:
            if len(gpus) != pod.gpus or len(set(gpus)) != len(gpus):
                raise AssertionError("placement with the wrong GPUs")
            self.gpu_free[node, gpus] -= pod.milli
            if (self.gpu_free[node] < 0).any():
                raise AssertionError("GPU over-committed")
            self.idle[node] -= pod.milli * pod.gpus
            self.used_milli += pod.milli * pod.gpus
        if (self.cpu_free[node] < 0) or (self.mem_free[node] < 0):
            raise AssertionError("cpu or memory over-committed")
        for model in {id(self.metric): self.metric, id(self.demand): self.demand}.values():
            model.refresh(node, self.gpu_free[node], int(self.idle[node]), int(self.cpu_free[node]))

    # -- hypothetical placements ----------------------------------------------------------------
    def candidates(self, pod: Pod, feasible: np.ndarray, model: _FragModel) -> _Candidates:
        """Every distinct way to place ``pod`` on the feasible nodes, with dF under ``model``.

        Sharing pods: one candidate per GPU that fits, keeping only the lowest index among GPUs of
        a node with equal free milli (they are interchangeable). Other pods: one candidate per
        node, using the lowest-indexed GPUs that fit (all fully free for whole-GPU pods).
        """
        change: tuple[np.ndarray, np.ndarray, int] | np.ndarray | None
        if pod.is_sharing:
            rows = self.gpu_free[feasible]
            width = rows.shape[1]
            earlier_equal = (rows[:, :, None] == rows[:, None, :]) & np.tri(
                width, width, -1, dtype=bool
            )
            r, g = np.nonzero((rows >= pod.milli) & ~earlier_equal.any(axis=2))
            node = feasible[r]
            before = rows[r, g]
            change = (before, before - pod.milli, 1)
            gpu, gpu_free_before = g, before
        else:
            node = feasible
            gpu = np.full(len(node), -1)
            gpu_free_before = np.zeros(len(node), dtype=np.int64)
            if not pod.needs_gpu:
                change = None
            elif pod.milli == GPU_MILLI:  # k fully free GPUs go to 0
                k = len(node)
                change = (np.full(k, GPU_MILLI), np.zeros(k, dtype=np.int64), pod.gpus)
            else:  # multi-GPU pod asking for less than a whole GPU each (not in the traces)
                rows = self.gpu_free[node].copy()
                fits = rows >= pod.milli
                rows -= (fits & (np.cumsum(fits, axis=1) <= pod.gpus)) * pod.milli
                change = rows
        total = pod.milli * pod.gpus if pod.needs_gpu else 0
        idle_after = self.idle[node] - total
        cpu_after = self.cpu_free[node] - pod.cpu_nz
        return _Candidates(
            node=node,
            gpu=gpu,
            gpu_free_before=gpu_free_before,
            idle_after=idle_after,
            cpu_after=cpu_after,
            delta_w=model.delta(node, change, idle_after, cpu_after),
            weight_total=model.weight_total,
        )


@dataclass
class _Candidates:
    node: np.ndarray
    gpu: np.ndarray  # the GPU for sharing pods, -1 otherwise
    gpu_free_before: np.ndarray
    idle_after: np.ndarray
    cpu_after: np.ndarray
    delta_w: np.ndarray  # weighted F(after) - F(before); / weight_total gives milli
    weight_total: int

    @property
    def delta_milli(self) -> np.ndarray:
        return self.delta_w / float(self.weight_total)


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
    return state.lowest_fitting_gpus(node, pod).tolist()


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
    ties: str = "order",
) -> tuple[int, list[int]]:
    """The pool's placement rule: FGD's quantised score, a fixed node order, and the demand
    that competes for what the pod takes.

    1. **Score** every feasible placement with :func:`fgd_int_score` of its ΔF (FGD's
       ``int(100 * sigmoid(-ΔF / 1000))``; the pool's ``placement.fgd_score``), higher first.
       Placements whose ΔF differ by less than a score step tie.
    2. **Ties go to a fixed node order** (``state.priority``; in the pool, the configured node
       order), so equal placements keep landing on the same nodes and the others stay whole.
    3. **Demand**: ΔF is taken against the typical pods *plus every multi-GPU shape of the
       trace* (:func:`ours_demand`): rare by pod count, so the paper's popularity cut drops
       them, but all-or-nothing asks for whole free GPUs on one node. In the pool the demand is
       every offer, weighted by how often it is asked for, so multi-GPU offers are always in.
    4. A sharing pod takes, on its node, the GPU with the best score, then the tightest, then
       the lowest index (the pool's order of a node's options).

    ``multi_demand`` ("all", "multi": multi-GPU pods only, "none": which pods score against
    :func:`ours_demand` rather than the typical pods) and
    ``ties`` ("order", or "tightest": least idle GPU, then least cpu, then order) exist for the
    ablation variants of :data:`ALL_POLICIES`.
    """
    uses_demand = multi_demand == "all" or (multi_demand == "multi" and pod.gpus >= 2)
    cand = state.candidates(pod, feasible, state.demand if uses_demand else state.metric)
    score = fgd_int_score(cand.delta_milli)
    prio = state.priority[cand.node]
    keys: list[np.ndarray] = [cand.gpu, cand.gpu_free_before]  # within a node (last keys first)
    if ties == "tightest":
        keys += [prio, cand.cpu_after, cand.idle_after]
    else:
        keys += [prio]
    best = int(np.lexsort((*keys, -score))[0])
    node = int(cand.node[best])
    if pod.is_sharing:
        return node, [int(cand.gpu[best])]
    return node, _gpus_for(state, node, pod, "lowest")


_CHOOSERS = {
    "best-fit": best_fit_choose,
    "fgd": fgd_choose,
    "ours": ours_choose,
    # Ablation variants (docs: the packing benchmark), each ``ours`` with one ingredient changed:
    "ours-float": float_choose,  # the previous rule: float ΔF, tightest-node ties
    "ours-tightest-ties": partial(ours_choose, ties="tightest"),
    "ours-no-multi": partial(ours_choose, multi_demand="none"),
    "ours-multi-pods-only": partial(ours_choose, multi_demand="multi"),
}
ALL_POLICIES: tuple[str, ...] = tuple(_CHOOSERS)
_USES_DEMAND = {"ours", "ours-float", "ours-tightest-ties", "ours-multi-pods-only"}


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

    def to_json(self) -> dict:
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
    demand = ours_demand(trace) if policy in _USES_DEMAND else None
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
) -> dict:
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

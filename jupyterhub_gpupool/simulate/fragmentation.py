"""The packing experiment's workload and cluster model: workload tuning, the FGD fragmentation
measure, and the cluster state the placement policies of ``packing`` score against.

Follows Weng et al., "Beware of Fragmentation: Scheduling GPU-Sharing Workloads with
Fragmentation Gradient Descent" (USENIX ATC 2023) and hkust-adsl/kubernetes-scheduler-simulator;
see ``packing`` for the experiment itself. Everything here is also importable from ``packing``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from .traces import DEFAULT_CPU_REQUEST, GPU_MILLI, NodeTable, PodTable
from .traces import clean_spec as _clean_spec
from .traces import spec_models as _spec_models

MAX_PODS_PER_NODE = 1001
"""The simulator's per-node pod limit (Kubernetes ``pods`` allocatable)."""


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
        prob: np.ndarray = self.count / self.count.sum()
        return prob

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


def ours_demand(
    pods: PodTable, threshold_pct: float = 95.0, *, weight: str = "count"
) -> TypicalPods:
    """The task distribution ``ours`` scores against: the typical pods plus every multi-GPU shape.

    The paper's cut keeps the most *popular* shapes covering 95% of pods. Multi-GPU asks are
    rare by pod count (about 1% of the default trace, so none survives the cut) but large in GPU
    demand, and all-or-nothing: one fails unless a single node has k fully free GPUs. Without
    them in the distribution the measure puts no value on keeping a node's GPUs together, and a
    float-precise minimiser happily breaks every 8-GPU node. So every shape with two or more GPUs
    that appears in the trace is kept, at its observed count (p_t = count_t / sum of counts),
    appended after the typical shapes. ``weight="gpus"`` (an ablation variant) counts each added
    shape once per GPU it asks for instead.
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
        count=np.r_[base.count, [c * (k[2] if weight == "gpus" else 1) for k, c in extra]].astype(
            np.int64
        ),
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
    fragment: np.ndarray = np.where(q3, too_small, idle[:, None])
    return fragment


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
    weighted: np.ndarray = frag @ typical.count / float(typical.count.sum())
    return weighted


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
        left: np.ndarray = idle * float(self.weight_total) - saved.astype(np.float64) @ self.weight
        return left

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
        delta: np.ndarray = after - self.frag_w[node]
        return delta


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

"""The FGD packing-benchmark harness (jupyterhub_gpupool.simulate.packing) on hand-built inputs."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from jupyterhub_gpupool.cli import main as cli_main
from jupyterhub_gpupool.simulate import packing as pk

# ------------------------------------------------------------------------------------------------
# helpers


def write_nodes(path, rows):
    """rows: (name, cpu_milli, memory_mib, gpu, model)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["sn", "cpu_milli", "memory_mib", "gpu", "model"])
        w.writerows(rows)
    return path


def write_pods(path, rows):
    """rows: (name, cpu_milli, memory_mib, num_gpu, gpu_milli, gpu_spec)."""
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec"])
        w.writerows(rows)
    return path


def pods_table(tmp_path, shapes, name="trace"):
    """shapes: list of (cpu, num_gpu, gpu_milli[, spec]); pod names keep the list order."""
    rows = []
    for i, shape in enumerate(shapes):
        cpu, n, milli, *spec = shape
        rows.append((f"p{i:04d}", cpu, 1024, n, milli, spec[0] if spec else ""))
    return pk.load_pods(write_pods(tmp_path / f"{name}.csv", rows))


def nodes_table(tmp_path, rows, name="nodes"):
    return pk.load_nodes(write_nodes(tmp_path / f"{name}.csv", rows))


def typical(rows):
    """rows: (cpu, milli, gpus, spec, count) -> TypicalPods."""
    return pk.TypicalPods(
        cpu=np.array([r[0] for r in rows], dtype=np.int64),
        milli=np.array([r[1] for r in rows], dtype=np.int64),
        gpus=np.array([r[2] for r in rows], dtype=np.int64),
        spec=tuple(r[3] for r in rows),
        count=np.array([r[4] for r in rows], dtype=np.int64),
    )


class ScriptedRng:
    """Stands in for numpy's Generator: fixed permutations and integer draws, in call order."""

    def __init__(self, permutations, draws=()):
        self.permutations = [np.asarray(p) for p in permutations]
        self.draws = list(draws)

    def permutation(self, n):
        perm = self.permutations.pop(0)
        assert sorted(perm.tolist()) == list(range(n))
        return perm

    def integers(self, low, high, size):
        if not self.draws:
            raise AssertionError("tuning drew more than the script holds")
        out, self.draws = self.draws[:size], self.draws[size:]
        assert all(low <= d < high for d in out)
        return np.array(out)


# ------------------------------------------------------------------------------------------------
# workload tuning


def test_tune_up_stops_at_first_per_gpu_overshoot_and_appends_clones(tmp_path):
    # p0000 CPU-only, p0001 one 500-milli share, p0002 four whole GPUs (per-GPU 1000, total 4000).
    pods = pods_table(tmp_path, [(1000, 0, 0), (2000, 1, 500), (8000, 4, 1000)])
    capacity = 8000  # target = 1.3 * 8000 = 10400; originals = 4500
    rng = ScriptedRng([[2, 0, 1]], draws=[2, 0, 1, 2, 0, 1, 1])
    order = pk.tune_workload(pods, capacity, 1.3, rng)
    # 4500 -(p2: 4500+1000 <= 10400)-> 8500 -(p0)-> 8500 -(p1)-> 9000 -(p2: 9000+1000 <= 10400,
    # added although its 4000 total overshoots)-> 13000; then p0 (CPU-only): 13000 > 10400 stops.
    assert order.tolist() == [2, 0, 1, 2, 0, 1, 2]


def test_tune_up_rejects_the_draw_that_would_pass_the_target(tmp_path):
    pods = pods_table(tmp_path, [(1000, 0, 0), (2000, 1, 500), (8000, 4, 1000)])
    # 4500 + 11 * 500 = 10000; the 12th share would make 10500 > 10400: stop, not added.
    rng = ScriptedRng([[0, 1, 2]], draws=[1] * 14)
    order = pk.tune_workload(pods, 8000, 1.3, rng)
    assert order.tolist() == [0, 1, 2] + [1] * 11
    assert pods.total_milli[order].sum() == 10000


def test_tune_up_with_numpy_rng_shuffles_originals_then_resamples(tmp_path):
    shapes = [(1000, 1, 1000)] * 5 + [(1000, 1, 300)] * 5 + [(500, 0, 0)] * 3
    pods = pods_table(tmp_path, shapes)
    order = pk.tune_workload(pods, 8000, 1.3, np.random.default_rng(3))
    n = len(pods)
    assert sorted(order[:n].tolist()) == list(range(n))  # each original exactly once, first
    assert len(order) > n
    assert pods.total_milli[order].sum() <= 10400  # single-GPU pods: no overshoot possible
    assert pods.total_milli[order].sum() > 10400 - 1000  # it stopped on a draw that overshoots
    again = pk.tune_workload(pods, 8000, 1.3, np.random.default_rng(3))
    assert np.array_equal(order, again)


def test_tune_down_removes_random_positions_until_within_target(tmp_path):
    pods = pods_table(tmp_path, [(1000, 4, 1000)] * 3 + [(1000, 1, 1000)])  # 13000 milli
    # Shuffled order [3, 2, 0, 1]; removal positions 2 (pod 0: 9000 left), then 1 (pod 2: 5000).
    rng = ScriptedRng([[3, 2, 0, 1], [2, 1, 0, 3]])
    order = pk.tune_workload(pods, 8000, 0.8, rng)  # target 6400
    assert order.tolist() == [3, 1]
    assert pods.total_milli[order].sum() == 5000


# ------------------------------------------------------------------------------------------------
# typical pods


def test_typical_pods_keep_95_percent_by_count_with_larger_tuple_first_on_ties(tmp_path):
    shapes = (
        [(4000, 1, 500)] * 40
        + [(8000, 0, 0)] * 30  # CPU-only pods take part
        + [(2000, 1, 1000)] * 10
        + [(3000, 2, 1000)] * 10  # ties with the row above: larger cpu goes first
        + [(0, 1, 200)] * 5  # cpu 0 counts as the non-zero request 100
        + [(100, 1, 300)] * 5  # ties with the row above: same cpu, larger milli first
    )
    pods = pods_table(tmp_path, shapes)
    typ = pk.typical_pods(pods)
    got = list(
        zip(
            typ.cpu.tolist(), typ.milli.tolist(), typ.gpus.tolist(), typ.count.tolist(), strict=True
        )
    )
    # cumulative 40, 70, 80, 90, 95 -> stop at >= 95% of 100 pods
    assert got == [
        (4000, 500, 1, 40),
        (8000, 0, 0, 30),
        (3000, 1000, 2, 10),
        (2000, 1000, 1, 10),
        (100, 300, 1, 5),
    ]
    assert typ.n_tuples == 6
    assert typ.prob.sum() == pytest.approx(1.0)
    assert typ.prob[0] == pytest.approx(40 / 95)


def test_typical_pods_ignore_memory_and_clamp_milli(tmp_path):
    rows = [
        ("a", 1000, 10, 1, 1500, ""),
        ("b", 1000, 99999, 1, 1000, ""),
        ("c", 500, 1, 0, 700, ""),
    ]
    pods = pk.load_pods(write_pods(tmp_path / "t.csv", rows))
    assert pods.gpu_milli.tolist() == [1000, 1000, 0]  # clamped; no GPU fields without num_gpu
    typ = pk.typical_pods(pods, threshold_pct=100)
    assert dict(zip(typ.milli.tolist(), typ.count.tolist(), strict=True)) == {1000: 2, 0: 1}


def test_ours_demand_adds_every_multi_gpu_shape_once(tmp_path):
    shapes = [(1000, 1, 500)] * 96 + [(64000, 8, 1000)] * 2 + [(32000, 4, 1000)] * 2
    pods = pods_table(tmp_path, shapes)
    base = pk.typical_pods(pods)
    assert base.gpus.tolist() == [1]  # the cut drops both multi-GPU shapes
    demand = pk.ours_demand(pods)
    shapes_kept = list(
        zip(demand.cpu.tolist(), demand.gpus.tolist(), demand.count.tolist(), strict=True)
    )
    assert shapes_kept == [(1000, 1, 96), (64000, 8, 2), (32000, 4, 2)]
    # the ablation's weighting counts each added shape once per GPU it asks for
    assert pk.ours_demand(pods, weight="gpus").count.tolist() == [96, 16, 8]


# ------------------------------------------------------------------------------------------------
# fragmentation


FRAG_TASKS = [
    # cpu, milli, gpus, spec, count        f_t on the node below (GPUs 1000/500/200/0, cpu 10000)
    (1000, 0, 0, "", 10),  # CPU-only ("XL"): all idle, 1700
    (2000, 300, 1, "", 20),  # Q3: only GPUs with < 300 free count: 200 + 0 = 200
    (20000, 600, 1, "", 5),  # Q4 (GPU fits, cpu lacking): 1700
    (1000, 1000, 2, "", 5),  # Q2 (one whole GPU only): 1700
    (20000, 1000, 2, "", 5),  # Q1 (both lacking): 1700
    (1000, 100, 1, "V100", 3),  # no_access (T4 node): 1700
    (10000, 100, 1, "T4|A10", 2),  # Q3 with cpu exactly enough, '|' list accepts T4: 0
]
FRAG_EXPECTED = (10 * 1700 + 20 * 200 + 5 * 1700 * 3 + 3 * 1700 + 2 * 0) / 50  # 1032 milli


def test_node_fragmentation_matches_hand_computation():
    typ = typical(FRAG_TASKS)
    access = pk.task_access(typ, ["T4"])
    assert access[0].tolist() == [True, True, True, True, True, False, True]
    frag = pk.node_fragmentation(np.array([[1000, 500, 200, 0]]), np.array([10000]), access, typ)
    assert frag[0] == pytest.approx(FRAG_EXPECTED)
    assert FRAG_EXPECTED == 1032
    ours = pk.ours_node_fragmentation(np.array([[1000, 500, 200, 0]]), [10000], access, typ)
    assert ours[0] == pytest.approx(1.032)
    # One cpu milli short of t6's 10000: it falls to Q4 and adds 2 * 1700 / 50.
    short = pk.node_fragmentation(np.array([[1000, 500, 200, 0]]), [9999], access, typ)
    assert short[0] == pytest.approx(FRAG_EXPECTED + 2 * 1700 / 50)


def test_cluster_state_reaches_the_same_fragmentation_by_placements(tmp_path):
    nodes = nodes_table(tmp_path, [("n0", 16000, 65536, 4, "T4")])
    state = pk.ClusterState(nodes, typical(FRAG_TASKS))
    state.place(0, [0], pk.Pod.make(2000, gpus=1, milli=1000))
    state.place(0, [1], pk.Pod.make(2000, gpus=1, milli=500))
    state.place(0, [2], pk.Pod.make(2000, gpus=1, milli=800))
    assert state.gpu_free[0].tolist() == [0, 500, 200, 1000]
    assert state.cpu_free[0] == 10000
    assert state.frag_milli() == pytest.approx(FRAG_EXPECTED)


def test_empty_cluster_fragmentation_counts_cpu_only_tasks(tmp_path):
    nodes = nodes_table(tmp_path, [("a", 64000, 1 << 20, 8, "G2"), ("b", 8000, 1 << 20, 2, "P100")])
    typ = typical([(1000, 0, 0, "", 1), (4000, 1000, 1, "", 1), (16000, 1000, 1, "", 2)])
    state = pk.ClusterState(nodes, typ)
    # a: only the CPU-only task counts (8000 * 1/4); b: CPU-only plus the 16000-cpu task (Q4).
    assert state.node_frag_milli().tolist() == pytest.approx([2000, 2000 * 3 / 4])


# ------------------------------------------------------------------------------------------------
# scores


def test_best_fit_raw_score_and_integer_min_max_normalisation():
    raw = pk.best_fit_raw(
        np.array([64000, 128000, 20000]), np.array([4000, 8000, 1000]), 16000, 1000
    )
    # (1 - (0.5*48000/128000 + 0.5*3000/8000)) * 100 = 62.5 -> 62; 12.5 -> 12; 98.4375 -> 98
    assert raw.tolist() == [62, 12, 98]
    assert pk.best_fit_normalise(raw).tolist() == [50 * 100 // 86, 0, 100]  # 58, floor division
    assert pk.best_fit_normalise(np.array([7, 7, 7])).tolist() == [0, 0, 0]
    assert pk.best_fit_normalise(np.array([10, 13, 11])).tolist() == [0, 100, 33]


def test_best_fit_ties_follow_the_node_priority_and_gpu_pick_is_tightest(tmp_path):
    rows = [(f"n{i}", 32000, 65536, 2, "T4") for i in range(3)]
    nodes = nodes_table(tmp_path, rows)
    state = pk.ClusterState(nodes, typical([(1000, 0, 0, "", 1)]), priority=np.array([2, 0, 1]))
    pod = pk.Pod.make(4000, gpus=1, milli=1000)
    node, gpus = pk.best_fit_choose(state, pod, state.feasible(pod))
    assert (node, gpus) == (1, [0])  # all raw scores equal -> all 0 -> smallest priority
    state.place(1, [1], pk.Pod.make(1000, gpus=1, milli=700))  # n1 GPUs: 1000, 300 free
    share = pk.Pod.make(1000, gpus=1, milli=200)
    node, gpus = pk.best_fit_choose(state, share, state.feasible(share))
    assert (node, gpus) == (1, [1])  # n1 is the tightest node; its 300-free GPU the tightest fit


def test_fgd_integer_score_truncates_the_sigmoid():
    # int(100 * sigmoid(-dF / 1000)): no change scores 50; one step is about 40 milli.
    assert pk.fgd_int_score(np.array([0.0, -41.0, -39.0, 1.0, 41.0])).tolist() == [
        50,
        51,
        50,
        49,
        48,
    ]


# ------------------------------------------------------------------------------------------------
# feasibility and GPU assignment


def test_feasibility_cpu_memory_pod_count_model_and_multi_gpu(tmp_path):
    nodes = nodes_table(
        tmp_path,
        [
            ("a", 64000, 65536, 4, "T4"),
            ("b", 64000, 65536, 2, "V100"),
            ("c", 64000, 65536, 8, "T4"),
        ],
    )
    state = pk.ClusterState(nodes, typical([(1000, 0, 0, "", 1)]))
    state.place(0, [1], pk.Pod.make(1000, 1024, gpus=1, milli=500))  # a: 1000/500/1000/1000
    assert state.feasible(pk.Pod.make(1000, gpus=2, milli=1000)).tolist() == [0, 1, 2]
    assert state.feasible(pk.Pod.make(1000, gpus=4, milli=1000)).tolist() == [2]
    assert state.feasible(pk.Pod.make(1000, gpus=3, milli=1000, spec="V100")).tolist() == []
    assert state.feasible(pk.Pod.make(1000, gpus=1, milli=600, spec="|V100||P100")).tolist() == [1]
    assert state.feasible(pk.Pod.make(64001, gpus=0)).tolist() == []
    assert state.feasible(pk.Pod.make(1000, memory=65536 - 1024 + 1)).tolist() == [1, 2]
    state.n_pods[2] = pk.MAX_PODS_PER_NODE  # c is full: 1001 pods
    assert state.feasible(pk.Pod.make(1000)).tolist() == [0, 1]
    # Whole-GPU pods take the lowest-indexed fully free GPUs, skipping the shared GPU 1.
    pod = pk.Pod.make(1000, gpus=2, milli=1000, spec="T4")
    feasible = state.feasible(pod)
    assert feasible.tolist() == [0]
    for choose in (pk.best_fit_choose, pk.fgd_choose, pk.ours_choose):
        assert choose(state, pod, feasible) == (0, [0, 2])


def test_ours_sharing_gpu_is_the_smallest_delta_then_the_tightest(tmp_path):
    nodes = nodes_table(tmp_path, [("n0", 64000, 65536, 3, "T4")])
    demand = typical([(1000, 500, 1, "", 10)])
    state = pk.ClusterState(nodes, demand)
    state.place(0, [0], pk.Pod.make(1000, gpus=1, milli=450))  # GPUs: 550, 1000, 1000
    pod = pk.Pod.make(1000, gpus=1, milli=100)
    # GPU 0 (the tightest) would drop to 450, too small for the 500 task: dF > 0; GPU 1: dF = 0.
    assert pk.ours_choose(state, pod, state.feasible(pod)) == (0, [1])
    assert pk.fgd_choose(state, pod, state.feasible(pod)) == (0, [1])
    assert pk.best_fit_choose(state, pod, state.feasible(pod)) == (0, [0])
    # 50 milli fits both GPU 0 (550 -> 500) and GPU 1 with dF = 0: the tie goes to the tighter.
    small = pk.Pod.make(1000, gpus=1, milli=50)
    assert pk.ours_choose(state, small, state.feasible(small)) == (0, [0])


def three_t4_nodes(tmp_path) -> tuple[pk.ClusterState, pk.Pod]:
    """Nodes a (2 T4, 64 cores), b (2 T4, 32 cores), c (4 T4) in node order a, c, b, a demand
    of CPU-only tasks, and a one-GPU pod to place."""
    rows = [
        ("a", 64000, 65536, 2, "T4"),
        ("b", 32000, 65536, 2, "T4"),
        ("c", 32000, 65536, 4, "T4"),
    ]
    nodes = nodes_table(tmp_path, rows)
    state = pk.ClusterState(nodes, typical([(1000, 0, 0, "", 1)]), priority=np.array([0, 2, 1]))
    return state, pk.Pod.make(1000, gpus=1, milli=1000)


def test_ours_node_ties_go_to_a_node_in_use_then_the_node_order(tmp_path):
    state, pod = three_t4_nodes(tmp_path)
    # Every node: dF = -1000 (CPU-only task), the same score, none in use: the order decides.
    assert pk.ours_choose(state, pod, state.feasible(pod)) == (0, [0])
    order_ties = pk._CHOOSERS["ours-order-ties"]
    assert order_ties(state, pod, state.feasible(pod)) == (0, [0])
    # A CPU-only pod on a leaves its GPUs free: a still counts as fresh.
    state.place(0, [], pk.Pod.make(1000))
    assert pk.ours_choose(state, pod, state.feasible(pod)) == (0, [0])
    # A GPU in use on b (last in node order): b takes the tie, the ablation keeps the order.
    state.place(1, [1], pk.Pod.make(1000, gpus=1, milli=1000))
    assert pk.ours_choose(state, pod, state.feasible(pod)) == (1, [0])
    assert order_ties(state, pod, state.feasible(pod)) == (0, [0])


def test_ours_tightest_ablation_breaks_ties_by_idle_then_cpu(tmp_path):
    state, pod = three_t4_nodes(tmp_path)
    # The ablation's ties: a and b leave 1000 idle, c 3000; b has less cpu.
    tightest = pk._CHOOSERS["ours-tightest-ties"]
    assert tightest(state, pod, state.feasible(pod)) == (1, [0])
    state.cpu_free[1] = 64000  # now a and b tie on idle and cpu: the priority decides (a: 0)
    assert tightest(state, pod, state.feasible(pod)) == (0, [0])


# ------------------------------------------------------------------------------------------------
# ours: the vectorised choice equals a scalar reading of its definition


def reference_ours(state, pod, demand, access, typical_pods, typical_access):
    """ours, written as plainly as possible from its definition (scalar loops)."""

    def frag(row, cpu, n):
        return pk.node_fragmentation(row[None, :], [cpu], access[n : n + 1], demand)[0]

    def score(delta):
        return int(1.0 / (1.0 + math.exp(delta / 1000)) * 100.0)

    nodes_gpus = state.nodes.gpus

    options = []
    for n in state.feasible(pod):
        row, cpu = state.gpu_free[n], int(state.cpu_free[n])
        fresh = all(row[: nodes_gpus[n]] == 1000)  # every GPU free: after the nodes in use
        prio = int(state.priority[n])
        before = frag(row, cpu, n)
        cpu_after = cpu - pod.cpu_nz
        if pod.is_sharing:
            for g in range(len(row)):
                if row[g] >= pod.milli:
                    after = row.copy()
                    after[g] -= pod.milli
                    s = score(frag(after, cpu_after, n) - before)
                    options.append((-s, fresh, prio, int(row[g]), g, int(n), [g]))
        else:
            after = row.copy()
            gpus = []
            if pod.needs_gpu:
                gpus = [g for g in range(len(row)) if row[g] >= pod.milli][: pod.gpus]
                after[gpus] -= pod.milli
            s = score(frag(after, cpu_after, n) - before)
            options.append((-s, fresh, prio, 0, 0, int(n), gpus))
    chosen = min(options, key=lambda o: o[:5])
    return chosen[5], chosen[6]


def test_ours_choose_matches_the_scalar_definition_and_caches_stay_exact(tmp_path):
    kinds = [
        (96000, 8, "G2"),
        (96000, 8, "G2"),
        (32000, 4, "V100"),
        (104000, 2, "T4"),
        (16000, 2, "P100"),
        (64000, 1, "T4"),
    ]
    rows = [(f"n{i:02d}", *kinds[i % 6][:1], 1 << 20, *kinds[i % 6][1:]) for i in range(12)]
    nodes = nodes_table(tmp_path, rows)
    demand = typical(
        [
            (3000, 800, 1, "", 30),
            (11000, 1000, 1, "", 25),
            (12000, 0, 0, "", 10),
            (8000, 470, 1, "", 12),
            (4000, 300, 1, "T4|P100", 8),
            (60000, 1000, 8, "", 2),
            (30000, 1000, 4, "", 2),
        ]
    )
    rng = np.random.default_rng(7)
    state = pk.ClusterState(nodes, typical(FRAG_TASKS), rng.permutation(len(nodes)), demand)
    access = pk.task_access(demand, nodes.model)
    metric = typical(FRAG_TASKS)
    metric_access = pk.task_access(metric, nodes.model)
    shapes = [
        (3000, 1, 800, ""),
        (11000, 1, 1000, ""),
        (12000, 0, 0, ""),
        (8000, 1, 470, ""),
        (4000, 1, 300, "T4|P100"),
        (20000, 2, 1000, ""),
        (2000, 1, 150, ""),
    ]
    placed = 0
    for i in range(160):
        cpu, n, milli, spec = shapes[rng.integers(len(shapes))]
        pod = pk.Pod.make(cpu, memory=1024, gpus=n, milli=milli, spec=spec)
        feasible = state.feasible(pod)
        if not len(feasible):
            continue
        got = pk.ours_choose(state, pod, feasible)
        want = reference_ours(state, pod, demand, access, metric, metric_access)
        assert got == want, f"pod {i}: {pod}"
        state.place(*got, pod)
        placed += 1
        direct = pk.node_fragmentation(
            state.gpu_free,
            state.cpu_free,
            pk.task_access(state.metric.typical, nodes.model),
            state.metric.typical,
        )
        assert state.frag_milli() == pytest.approx(direct.sum())
        assert state.demand.frag_w / demand.count.sum() == pytest.approx(
            pk.node_fragmentation(state.gpu_free, state.cpu_free, access, demand)
        )
    assert placed > 60


# ------------------------------------------------------------------------------------------------
# metrics


def test_arrived_bins_round_half_to_even_and_fall_back_to_neighbours():
    # 16 GPUs. Arrived 12.5% -> bin 12 (half to even), 13% -> 13, 62.5% -> 62, 63% -> 63.
    arrived = np.array([2000, 2080, 10000, 10080])
    used = np.array([1600, 3200, 4800, 6400])  # 10, 20, 30, 40 %
    frag = np.array([800.0, 1600.0, 0.0, 0.0])
    bins = pk.bin_samples(arrived, used, frag, total_gpus=16, points=[12, 13, 14, 62, 63, 90])
    assert bins[12] == {"alloc_pct": 10.0, "frag_pct": 5.0}
    assert bins[13] == {"alloc_pct": 20.0, "frag_pct": 10.0}
    assert bins[62]["alloc_pct"] == 30.0 and bins[63]["alloc_pct"] == 40.0
    assert bins[14] == {"alloc_pct": 20.0, "frag_pct": 10.0}  # empty: uses bins 13..15
    assert math.isnan(bins[90]["alloc_pct"])


def test_arrived_bin_means_all_samples_of_the_bin():
    # 1000 GPUs: 89.6% and 90.4% both round to 90; alloc per sample rounded to 2 decimals first.
    arrived = np.array([896000, 904000, 915000])
    used = np.array([896000, 900001, 900001])
    bins = pk.bin_samples(arrived, used, np.zeros(3), total_gpus=1000, points=[90])
    assert bins[90]["alloc_pct"] == round((89.6 + 90.0) / 2, 2)


# ------------------------------------------------------------------------------------------------
# command line


def tiny_trace(tmp_path):
    """30 two-GPU and 10 four-GPU nodes; pods small enough that every arrived bin has samples."""
    folder = tmp_path / "trace-data"
    folder.mkdir()
    nodes = write_nodes(
        folder / "nodes.csv",
        [(f"node-{i:02d}", 32000, 131072, 4 if i % 4 == 0 else 2, "T4") for i in range(40)],
    )
    shapes = [(2000, 1, 250), (4000, 1, 500), (8000, 1, 1000), (3000, 0, 0), (6000, 2, 1000)]
    pods = write_pods(
        folder / "openb_pod_list_tiny.csv",
        [(f"pod-{i:03d}", shapes[i % 5][0], 2048, *shapes[i % 5][1:], "") for i in range(150)],
    )
    return pods, nodes


def test_run_cli_writes_the_json_shape_and_compares_with_published(tmp_path, capsys):
    pods, nodes = tiny_trace(tmp_path)
    with open(tmp_path / "fgd_expected_summary.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["workload", "policy", "arrived_pct", "alloc_pct_mean", "frag_pct_mean"])
        w.writerow(["openb_pod_list_tiny", "05-BestFit", 90, 88.5, 7.25])
        w.writerow(["openb_pod_list_tiny", "06-FGD", 90, 89.5, 5.5])
        w.writerow(["openb_pod_list_other", "05-BestFit", 90, 1.0, 1.0])
    out = tmp_path / "out" / "result.json"
    argv = ["simulate", "packing", "--pods", str(pods), "--nodes", str(nodes)]
    argv += ["--seeds", "3,5", "--policies", "ours,best-fit,fgd", "--workers", "1"]
    assert cli_main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["trace"] == "openb_pod_list_tiny"
    assert report["seeds"] == [3, 5]
    assert list(report["policies"]) == ["ours", "best-fit", "fgd"]
    for means in report["policies"].values():
        assert list(means) == ["90", "100", "110", "120", "130"]
        for cell in means.values():
            assert set(cell) == {"alloc_pct", "frag_pct"}
            assert 50 < cell["alloc_pct"] <= 100
            assert 0 <= cell["frag_pct"] < 50
    assert report["published"]["best-fit"]["90"] == {"alloc_pct": 88.5, "frag_pct": 7.25}
    assert len(report["per_seed"]["ours"]) == 2
    printed = capsys.readouterr().out
    assert "policy: best-fit" in printed and "88.500" in printed and "89.500" in printed


def test_simulate_is_deterministic_and_policies_share_arrivals(tmp_path):
    pods_csv, nodes_csv = tiny_trace(tmp_path)
    pods, nodes = pk.load_pods(pods_csv), pk.load_nodes(nodes_csv)
    runs = {p: pk.simulate(pods, nodes, 11, p) for p in ("ours", "best-fit", "fgd")}
    assert len({r.n_pods for r in runs.values()}) == 1
    again = pk.simulate(pods, nodes, 11, "ours")
    assert again.bins == runs["ours"].bins and again.n_failed == runs["ours"].n_failed
    for r in runs.values():
        assert r.bins[130]["alloc_pct"] <= 100


def test_every_ablation_variant_runs_to_a_valid_packing(tmp_path):
    # place() raises on any over-commit, so a finished run is a valid packing for each variant
    pods_csv, nodes_csv = tiny_trace(tmp_path)
    pods, nodes = pk.load_pods(pods_csv), pk.load_nodes(nodes_csv)
    runs = {p: pk.simulate(pods, nodes, 5, p) for p in pk.ALL_POLICIES}
    assert len({r.n_pods for r in runs.values()}) == 1
    for r in runs.values():
        assert 50 < r.bins[130]["alloc_pct"] <= 100


@pytest.mark.parametrize(
    ("text", "seeds"),
    [("42-51", list(range(42, 52))), ("42,43,50", [42, 43, 50]), ("7", [7]), (" 3-3 ", [3])],
)
def test_parse_seeds(text, seeds):
    assert pk.parse_seeds(text) == seeds


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "empty"),
        ("51-42", "backwards"),
        ("a-b", "not a range"),
        ("1,,2", "not a range"),
        ("42-", "not a range"),
        ("-3", "non-negative"),
        ("4,4", "repeats"),
    ],
)
def test_parse_seeds_rejects_bad_values(text, message):
    with pytest.raises(ValueError, match=message):
        pk.parse_seeds(text)


def test_bad_flags_are_one_line_usage_errors(tmp_path, capsys):
    pods, nodes = tiny_trace(tmp_path)
    base = ["simulate", "packing", "--pods", str(pods), "--nodes", str(nodes)]
    for extra, message in [
        (["--seeds", "51-42"], "backwards"),
        (["--policies", "ours,worst-fit"], "unknown worst-fit"),
        (["--tune", "0"], "positive"),
        (["--workers", "0"], "at least 1"),
    ]:
        with pytest.raises(SystemExit) as exc:
            cli_main(base + extra)
        assert exc.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1

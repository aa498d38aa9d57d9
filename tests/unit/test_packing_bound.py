"""The packing upper bound on tiny instances: never below the best packing, and the packing it
finds from below is a real one."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from jupyterhub_gpupool.simulate import bound, traces

pytest.importorskip("scipy")


def write(tmp_path, name, header, rows):
    path = tmp_path / name
    path.write_text("\n".join([header, *(",".join(map(str, r)) for r in rows)]) + "\n")
    return path


def best_packing(pods, nodes):
    """Brute force: every assignment of pods to nodes (or nowhere), GPU by GPU."""
    best = 0
    n = len(pods)
    for choice in itertools.product(range(len(nodes) + 1), repeat=n):
        ok, value = True, 0
        for k, node in enumerate(nodes):
            mine = [pods[i] for i in range(n) if choice[i] == k + 1]
            cpu, gpus = node
            if sum(p[0] for p in mine) > cpu:
                ok = False
                break
            whole = sum(p[1] for p in mine if p[2] == 1000)
            shares = sorted((p[2] for p in mine if p[2] < 1000), reverse=True)
            free = [1000] * (gpus - whole) if whole <= gpus else None
            if free is None:
                ok = False
                break
            for m in shares:  # exact for these tiny cases: try first fit decreasing
                for j, f in enumerate(free):
                    if f >= m:
                        free[j] -= m
                        break
                else:
                    ok = False
            if not ok:
                break
        if ok:
            value = sum(pods[i][1] * pods[i][2] for i in range(n) if choice[i])
            best = max(best, value)
    return best


def test_bound_is_above_the_best_packing_and_the_found_packing_below(tmp_path):
    nodes_csv = write(
        tmp_path,
        "nodes.csv",
        "sn,cpu_milli,memory_mib,gpu,model",
        [("a", 8000, 65536, 2, "T4"), ("b", 4000, 65536, 1, "T4")],
    )
    # (cpu, num_gpu, milli): shares that do not pair well, a 2-GPU pod, cpu-hungry pods
    shapes = [(1000, 1, 600), (1000, 1, 600), (1000, 1, 500), (3000, 2, 1000), (4000, 1, 300)]
    pods_csv = write(
        tmp_path,
        "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        [(f"p{i}", c, 1024, g, m) for i, (c, g, m) in enumerate(shapes)],
    )
    nodes, pods = traces.load_nodes(nodes_csv), traces.load_pods(pods_csv)
    res = bound.config_lp_bound(pods, nodes, np.arange(len(pods)), time_limit=30)
    optimum = best_packing([(c, g, m) for c, g, m in shapes], [(8000, 2), (4000, 1)])
    assert res.packing_found_milli is not None
    assert res.packing_found_milli <= optimum <= res.upper_milli + 1e-6
    assert res.upper_milli <= res.fluid_milli
    assert res.converged


def test_arrived_prefix_ends_with_the_bin():
    nodes = traces.NodeTable(("n",), np.array([1000]), np.array([1000]), np.array([4]), ("T4",))
    pods = traces.PodTable(
        "t",
        tuple(f"p{i}" for i in range(8)),
        np.full(8, 100),
        np.full(8, 100),
        np.ones(8, dtype=np.int64),
        np.full(8, 500),
        ("",) * 8,
    )
    prefix = bound.arrived_prefix(pods, nodes, seed=1, arrived_pct=100, tune=1.0)
    # 8 x 500 milli = 100 % of 4 GPUs: every pod has arrived by the end of the 100 % bin
    assert sorted(prefix.tolist()) == list(range(8))
    assert len(bound.arrived_prefix(pods, nodes, seed=1, arrived_pct=50, tune=1.0)) == 4


def tiny_instance(tmp_path, rng, n_pods):
    """Random pods (cpu, GPU count, milli) on two nodes, as CSV tables and as tuples."""
    node_rows = [("a", 8000, 65536, 2, "T4"), ("b", 4000, 65536, 1, "T4")]
    shapes = []
    for _ in range(n_pods):
        if rng.random() < 0.3:
            shapes.append((int(rng.integers(1, 5)) * 1000, int(rng.integers(1, 3)), 1000))
        else:
            shapes.append((int(rng.integers(1, 5)) * 1000, 1, int(rng.integers(1, 10)) * 100))
    nodes_csv = write(tmp_path, "nodes.csv", "sn,cpu_milli,memory_mib,gpu,model", node_rows)
    pods_csv = write(
        tmp_path,
        "pods.csv",
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli",
        [(f"p{i}", c, 1024, g, m) for i, (c, g, m) in enumerate(shapes)],
    )
    return traces.load_nodes(nodes_csv), traces.load_pods(pods_csv), shapes, [(8000, 2), (4000, 1)]


@pytest.mark.parametrize("seed", range(6))
def test_bound_exact_coarse_and_compact_are_never_below_the_optimum(tmp_path, seed):
    """Coarse classes ask for their members' least and are worth their most: a relaxation."""
    nodes, pods, shapes, node_caps = tiny_instance(tmp_path, np.random.default_rng(seed), 6)
    optimum = best_packing(shapes, node_caps)
    every = np.arange(len(pods))
    exact = bound.config_lp_bound(pods, nodes, every, time_limit=30)
    assert exact.converged
    assert optimum <= exact.upper_milli + 1e-6
    assert exact.packing_found_milli is not None and exact.packing_found_milli <= optimum
    assert exact.upper_milli <= exact.compact_milli + 1e-6 <= exact.fluid_milli + 2e-6
    for grid in (0.3, 1.0):
        coarse = bound.config_lp_bound(pods, nodes, every, time_limit=30, grid=grid)
        assert coarse.classes <= exact.classes
        assert optimum <= coarse.upper_milli + 1e-6
        assert coarse.packing_found_milli is None  # its pods are relaxed ones: no real packing
    # too many share patterns: capacity and dual-feasible cuts only, looser but still valid
    loose = bound.config_lp_bound(pods, nodes, every, time_limit=30, max_patterns=0)
    assert optimum <= exact.upper_milli <= loose.upper_milli + 1e-6


def test_share_patterns_are_the_maximal_ones():
    expected = [
        (0, 0, 3),
        (0, 1, 2),
        (0, 2, 0),
        (1, 0, 1),
        (1, 1, 0),
    ]  # 600+300 leaves 100: maximal
    assert sorted(bound._share_patterns([600, 400, 300], 100)) == expected
    assert bound._share_patterns([100, 50], 3) is None  # 11 patterns > 3


def test_coarse_classes_take_the_least_need_and_the_most_worth():
    pods = traces.PodTable(
        "t",
        ("a", "b", "c", "d"),
        np.array([1000, 1040, 1000, 5000]),  # cpu: a and b share a bucket at grid 0.1
        np.array([1050, 1024, 1024, 1024]),
        np.array([1, 1, 1, 1]),
        np.array([500, 520, 1000, 500]),
        ("",) * 4,
    )
    exact = bound._classes(pods, np.arange(4))
    assert len(exact.count) == 4 and sorted(exact.worth.tolist()) == [500, 500, 520, 1000]
    coarse = bound._classes(pods, np.arange(4), grid=0.1)
    assert int(coarse.count.sum()) == 4 and len(coarse.count) == 3
    merged = int(np.flatnonzero(coarse.count == 2)[0])
    assert (coarse.cpu[merged], coarse.mem[merged], coarse.milli[merged]) == (1000, 1024, 500)
    assert coarse.worth[merged] == 520


def test_no_gpu_pod_arrived_bounds_at_zero():
    nodes = traces.NodeTable(("n",), np.array([1000]), np.array([1000]), np.array([4]), ("T4",))
    pods = traces.PodTable(
        "t", ("a",), np.array([100]), np.array([100]), np.array([0]), np.array([0]), ("",)
    )
    for idx in (np.arange(0), np.arange(1)):
        res = bound.config_lp_bound(pods, nodes, idx, time_limit=5)
        assert (res.upper_milli, res.packing_found_milli, res.converged) == (0.0, 0, True)

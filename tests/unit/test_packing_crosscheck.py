"""The packing benchmark runs *our* placement policy: its vectorised fragmentation measure must be
the pool's own (``placement.node_fragmentation``) on every state the trace can produce, and the
allocator's incremental ΔF must equal the difference of two full computations."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.placement import (
    Demand,
    Shape,
    best_on_node,
    key_options,
    node_fragmentation,
)
from jupyterhub_gpupool.simulate.packing import TypicalPods, ours_node_fragmentation, task_access

CATALOG = default_catalog()
MODELS = ["G2", "G3", "T4", "V100M16"]

task = st.tuples(
    st.sampled_from([0, 100, 4000, 16000, 64000]),  # cpu (non-zero request)
    st.sampled_from([0, 100, 250, 500, 700, 1000]),  # per-GPU milli (0: CPU-only)
    st.integers(1, 4),  # GPU count for whole-GPU tasks
    st.sampled_from(["", "G2", "G3|T4", "V100M16"]),  # model spec
    st.integers(1, 50),  # how many pods of this shape
)


def _shape(cpu: int, milli: int, gpus: int, spec: str, count: int) -> Shape:
    models = frozenset(spec.split("|")) if spec else None
    if milli == 0:
        return Shape("cpu", 0, 0, cpu_milli=cpu, weight=count)
    if milli == 1000:
        return Shape("gpu", gpus, 1000, models=models, cpu_milli=cpu, weight=count)
    return Shape("shared", 1, milli, models=models, cpu_milli=cpu, weight=count)


@settings(max_examples=300, deadline=None)
@given(
    model=st.sampled_from(MODELS),
    free=st.lists(st.sampled_from([0, 50, 250, 300, 500, 750, 1000]), min_size=1, max_size=8),
    cpu_free=st.sampled_from([0, 2000, 8000, 32000, 96000]),
    tasks=st.lists(task, min_size=1, max_size=8),
)
def test_benchmark_fragmentation_is_the_pools(model, free, cpu_free, tasks):
    tasks = [(c, m, g if m == 1000 else (0 if m == 0 else 1), s, n) for c, m, g, s, n in tasks]
    typical = TypicalPods(
        cpu=np.array([t[0] for t in tasks]),
        milli=np.array([t[1] for t in tasks]),
        gpus=np.array([t[2] for t in tasks]),
        spec=tuple(t[3] for t in tasks),
        count=np.array([t[4] for t in tasks], dtype=float),
    )
    gpu_free = np.array([free], dtype=float)
    vectorised = ours_node_fragmentation(
        gpu_free, np.array([cpu_free]), task_access(typical, [model]), typical
    )[0]
    gpu_model = CATALOG.model(model)
    keys = [("n", gpu_model, "auto", f) for f in free]
    scalar = node_fragmentation(keys, [_shape(*t) for t in tasks], cpu_free=cpu_free)
    assert abs(vectorised - scalar) < 1e-9


mig_key = st.builds(
    lambda inst: ("m", CATALOG.model("A100-80GB"), True, tuple(sorted(inst))),
    st.sampled_from(
        [
            [],
            [("3g.40gb", 4, True)],
            [("3g.40gb", 4, True), ("1g.10gb", 0, True)],
            [("2g.20gb", 0, False), ("1g.10gb", 2, True)],
            [("1g.10gb", s, True) for s in range(5)],
        ]
    ),
)
plain_key = st.builds(
    lambda f: ("n", CATALOG.model("L4"), "auto", f), st.sampled_from([0, 250, 500, 1000])
)
DEMAND = Demand(
    [
        Shape("mig", profile="1g.10gb", milli=0, models=frozenset({"A100-80GB"}), weight=3),
        Shape("mig", profile="3g.40gb", milli=0, models=frozenset({"A100-80GB"}), weight=1),
        Shape("shared", milli=250, weight=2),
        Shape("gpu", count=2, weight=1),
        Shape("gpu", count=1, weight=2),
    ]
)


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.one_of(mig_key, plain_key), min_size=1, max_size=6), pick=st.integers(0, 4))
def test_incremental_delta_equals_full_recomputation(keys, pick):
    keys = tuple(keys)
    shape = DEMAND.shapes[pick].unweighted()
    choice = best_on_node(keys, shape, DEMAND)
    if choice is None:
        assert sum(bool(key_options(k, shape)) for k in keys) < shape.count
        return
    after = list(keys)
    for pos, _, _, new_key in choice.picks:
        after[pos] = new_key
    full = node_fragmentation(after, DEMAND) - node_fragmentation(keys, DEMAND)
    assert abs(choice.delta - full) < 1e-9


def test_the_pools_score_is_the_benchmarks_fgd_score():
    # the pool scores ΔF in GPU units, the benchmark in milli: the same integer either way
    from jupyterhub_gpupool.pool.placement import fgd_score
    from jupyterhub_gpupool.simulate.packing import fgd_int_score

    deltas = np.r_[np.linspace(-12, 12, 2401), [0.0, 1e-12, -1e-12, 0.04, -0.04, 600.0]]
    pool = [fgd_score(float(d)) for d in deltas]
    assert pool == fgd_int_score(deltas * 1000.0).tolist()


@settings(max_examples=200, deadline=None)
@given(keys=st.lists(st.one_of(mig_key, plain_key), min_size=1, max_size=6))
def test_in_use_is_the_benchmarks_not_fresh(keys):
    # the benchmark ranks a node whose GPUs are all free after the others of equal score; the
    # pool the same: a state is in use when a GPU holds a share, a whole GPU or a MIG instance
    from jupyterhub_gpupool.pool.placement import key_free, state_in_use

    assert state_in_use(tuple(keys)) == any(key_free(k) < 1.0 for k in keys)


def test_equal_scores_go_to_a_node_in_use_in_the_pool_and_the_benchmark(tmp_path):
    """Two 2-GPU nodes, only 0.25 shares asked for: every placement has ΔF = 0 (the same
    score). With the first node in order empty and the second in use, both rules pick the
    second; with both empty, the first."""
    from jupyterhub_gpupool.pool.allocator import Allocator, Grant
    from jupyterhub_gpupool.pool.model import Gpu, Node, Request, parse_offer
    from jupyterhub_gpupool.simulate import packing as pk

    h100 = CATALOG.model("H100-80GB")
    nodes = [Node(n, gpus=[Gpu(f"{n}-{i}", i, h100) for i in range(2)]) for n in ("a", "b")]
    share = parse_offer({"name": "s", "kind": "shared", "fraction": 0.25}, CATALOG)
    alloc = Allocator(nodes, [share])

    def grant(rid: str) -> str:
        decision = alloc.submit(Request(rid, "u", "s"), 0.0)
        assert isinstance(decision, Grant), decision
        return decision.node

    assert [grant(f"r{i}") for i in range(9)] == ["a"] * 8 + ["b"]  # a full, then b
    for i in range(8):
        alloc.release(f"r{i}", 1.0)
    assert grant("next") == "b"  # a (first in order) is fresh again, b is in use

    csv = tmp_path / "nodes.csv"
    csv.write_text(
        "sn,cpu_milli,memory_mib,gpu,model\na,64000,65536,2,H100\nb,64000,65536,2,H100\n"
    )
    table = pk.load_nodes(csv)
    demand = TypicalPods(
        cpu=np.array([100]),
        milli=np.array([250]),
        gpus=np.array([1]),
        spec=("",),
        count=np.array([1]),
    )
    state = pk.ClusterState(table, demand)
    pod = pk.Pod.make(100, gpus=1, milli=250)
    assert pk.ours_choose(state, pod, state.feasible(pod))[0] == 0  # both fresh: the order
    state.place(1, [0], pod)
    assert pk.ours_choose(state, pod, state.feasible(pod)) == (1, [0])  # b is in use
    assert pk._CHOOSERS["ours-order-ties"](state, pod, state.feasible(pod))[0] == 0

"""The store's reads of the pool state for the service's and the Kubernetes readers' own use
(issue 34: nothing outside the store holds the allocator): the metrics' gauges, the alert
rules' facts, the GPUs a sample batch names with their holders, the MIG profiles of the nodes
page, a cluster's nodes and devices, and a node as a label re-partition leaves it. Each a
typed, frozen view that pickles (it crosses the store process's pipe)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.devices import (
    ClusterGpuView,
    ClusterNodeView,
    GpuHoldersView,
    GpuNodesView,
)
from jupyterhub_gpupool.store.read.gauges import AlertFactsView, GpuHealthView, ModelCapacityView
from jupyterhub_gpupool.store.read.mig import MigProfileView
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import StoreClock, make_store

#: n1 (cluster default): two exclusive H100s, a dynamic-MIG A100, a shared L4; e1 (east): an H100.
POOL = {
    "clusters": ["default", "east"],
    "nodes": [
        {
            "name": "n1",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [
                {"model": "H100-80GB", "count": 2, "sharing": "exclusive"},
                {"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}},
                {"model": "L4", "sharing": "shared"},
            ],
        },
        {
            "name": "e1",
            "cluster": "east",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 1, "sharing": "exclusive"}],
        },
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]},
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "l4-q", "kind": "shared", "fraction": 0.25, "models": ["L4"]},
    ],
    "quotas": {"default": {"guarantee": 4, "limit": 8}},
}
H100_PROFILES = ("1g.10gb", "1g.10gb+me", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock, POOL)


def uuids(store: Store) -> dict[str, str]:
    """GPU uuid by ``node/model/index`` (h0, h1, a100, l4 on n1; e0 on e1)."""
    names = iter(["h0", "h1", "a100", "l4", "e0"])
    return {
        next(names): g.uuid
        for c in store.pool(detail=True).clusters or ()
        for n in sorted(c.nodes, key=lambda n: n.name != "n1")
        for g in n.gpus
    }


def holders(store: Store, clock: StoreClock) -> dict[str, str]:
    """alice two H100s (group ml), bob a quarter L4, carol an A100 slice, dave e1's H100;
    erin waits ten minutes for an H100."""
    ids = {
        "alice": store.allocate("alice", "", "h100x2", group="ml", groups=["ml"]).id,
        "bob": store.allocate("bob", "", "l4-q").id,
        "carol": store.allocate("carol", "", "a100-1g").id,
        "dave": store.allocate("dave", "", "h100").id,
    }
    waiting = store.allocate("erin", "", "h100")
    assert waiting.state == "queued"
    ids["erin"] = waiting.id
    clock.advance(minutes=10)
    return ids


def frozen_and_pickles(view: object) -> None:
    views = view if isinstance(view, tuple) else (view,)
    for v in views:
        assert dataclasses.is_dataclass(v)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(v, dataclasses.fields(v)[0].name, None)
    assert pickle.loads(pickle.dumps(view)) == view


def test_the_gauges_and_the_alert_facts(store, clock):
    ids = holders(store, clock)
    g = uuids(store)
    view = store.pool_gauges()
    frozen_and_pickles(view)
    assert view.capacity == (
        ModelCapacityView("H100-80GB", 3, 0.0),
        ModelCapacityView("A100-80GB", 1, 6 / 7),
        ModelCapacityView("L4", 1, 0.75),
    )
    assert view.offers == ("h100", "h100x2", "a100-1g", "l4-q")
    assert view.waiting == (("h100", 1), ("h100x2", 0), ("a100-1g", 0), ("l4-q", 0))
    assert view.available == (("h100", 0), ("h100x2", 0), ("a100-1g", 6), ("l4-q", 3))
    assert view.unreachable == (("n1", False), ("e1", False))
    assert view.gpus == tuple(
        GpuHealthView(node, g[name], True)
        for node, name in [("n1", "h0"), ("n1", "h1"), ("n1", "a100"), ("n1", "l4"), ("e1", "e0")]
    )
    # alice's two GPUs in ml; bob's quarter, carol's seventh and dave's GPU in no group
    assert view.group_units[0] == ("ml", 2.0)
    assert view.group_units[1][0] == "" and view.group_units[1][1] == pytest.approx(
        0.25 + 1 / 7 + 1
    )
    facts = AlertFactsView((), (), {"h100": 600.0}, ("h100",), {})
    assert view.facts == facts
    now = epoch(clock.now)
    assert store.alert_facts(now) == facts
    frozen_and_pickles(store.alert_facts(now + 60))
    assert store.alert_facts(now + 60).oldest_wait == {"h100": 660.0}
    assert ids["erin"] not in store.cluster("default").live  # a waiter holds nothing


def test_the_gpus_a_sample_batch_names_with_their_nodes_and_holders(store, clock):
    ids = holders(store, clock)
    g = uuids(store)
    view = store.gpu_holders([g["h0"], g["a100"], g["l4"], g["e0"], g["h0"], "GPU-nope"])
    frozen_and_pickles(view)
    assert view == GpuHoldersView(
        whole={g["h0"]: ids["alice"], g["e0"]: ids["dave"]},
        shares={g["l4"]: (ids["bob"],)},
        instances={g["a100"]: ((0, ids["carol"]),)},
        # alice's busy time on one GPU is half of her lease's: it holds two
        lease_devices={ids["alice"]: 2, ids["carol"]: 1, ids["bob"]: 1, ids["dave"]: 1},
    )
    assert store.gpu_holders([g["h1"]]).lease_devices == {ids["alice"]: 2}
    nodes = store.gpu_nodes([g["h0"], g["e0"], "GPU-nope"])
    frozen_and_pickles(nodes)
    assert nodes == GpuNodesView({g["h0"]: "n1", g["e0"]: "e1"})
    store.release(ids["alice"])  # erin, waiting, gets one of the two
    after = store.gpu_holders([g["h0"], g["h1"]])
    assert list(after.whole.values()) == [ids["erin"]]
    assert after.lease_devices == {ids["erin"]: 1} and after.shares == after.instances == {}
    # a copy: what the view said stays as it was
    assert view.whole[g["h0"]] == ids["alice"]


def test_the_mig_profiles_of_the_pools_models(store):
    view = store.mig_profiles()
    frozen_and_pickles(view)
    assert [m.model for m in view] == ["H100-80GB", "A100-80GB"]  # first GPU's order; no L4
    a100 = view[1].profiles
    assert tuple(p.name for p in a100) == H100_PROFILES
    assert a100[0] == MigProfileView("1g.10gb", (0, 1, 2, 3, 4, 5, 6), 1)
    assert a100[-1] == MigProfileView("7g.80gb", (0,), 8)


def test_a_clusters_nodes_devices_and_live_leases(store, clock):
    ids = holders(store, clock)
    g = uuids(store)
    view = store.cluster("default")
    frozen_and_pickles(view)
    assert view.nodes == (
        ClusterNodeView(
            "n1",
            (
                ClusterGpuView(g["h0"], False, "exclusive", H100_PROFILES, ()),
                ClusterGpuView(g["h1"], False, "exclusive", H100_PROFILES, ()),
                # carol's slice is planned, not made yet: nothing on the device to publish
                ClusterGpuView(g["a100"], True, "auto", H100_PROFILES, ()),
                ClusterGpuView(g["l4"], False, "shared", (), ()),
            ),
        ),
    )
    assert view.live == frozenset(ids[u] for u in ("alice", "bob", "carol", "dave"))
    east = store.cluster("east")
    assert [n.name for n in east.nodes] == ["e1"] and east.live == view.live
    assert store.cluster("west").nodes == ()


def test_a_node_as_a_label_repartition_leaves_it(store, clock):
    holders(store, clock)
    g = uuids(store)
    node = store.repartitioned_node("n1", {g["a100"]: [("3g.40gb", 0), ("3g.40gb", 4)]})
    assert node is not None and node.name == "n1" and node.cluster == "default"
    by_uuid = {x.uuid: x for x in node.gpus}
    a100 = by_uuid[g["a100"]]
    assert [(i.profile, i.start, i.uuid, i.lease) for i in a100.instances] == [
        ("3g.40gb", 0, None, None),
        ("3g.40gb", 4, None, None),
    ]
    assert a100.mig_enabled
    assert all(x.whole_lease is None and x.shares == {} for x in node.gpus)  # nothing held
    assert (node.cpu_used, node.memory_used) == (0, 0)
    off = store.repartitioned_node("n1", {g["a100"]: []})
    assert off is not None and not {x.uuid: x for x in off.gpus}[g["a100"]].mig_enabled
    # a copy: the pool's own node still holds alice's GPUs and carol's slice
    view = store.gpu_holders([g["h0"], g["a100"]])
    assert g["h0"] in view.whole and g["a100"] in view.instances
    assert store.repartitioned_node("nope", {}) is None

"""One pool over several clusters: the config names them, agents report theirs, offers and
hubs are restricted to some, and the pool grants only where the asking hub can launch."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.poolconfig import parse_pool_config
from jupyterhub_gpupool.service.apihandlers.errors import status_of
from jupyterhub_gpupool.service.ingest import node_from_inventory
from jupyterhub_gpupool.spawner.local import foreign_node
from jupyterhub_gpupool.store import Store, StoreError
from tests.fakes import StoreClock, make_store

POOL = {
    "clusters": ["eu", "us"],
    "nodes": [
        {"name": "eu-1", "cluster": "eu", "gpus": [{"model": "H100-80GB", "count": 1}]},
        {"name": "us-1", "cluster": "us", "gpus": [{"model": "H100-80GB", "count": 1}]},
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100-eu", "kind": "gpu", "models": ["H100-80GB"], "clusters": ["eu"]},
    ],
    "quotas": {"default": {"guarantee": 0, "limit": 4}},
}


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock, POOL)


# -- the config --------------------------------------------------------------------------------


def test_one_cluster_called_default_without_a_clusters_list():
    config = parse_pool_config({"nodes": [{"name": "n", "gpus": []}]}, default_catalog())
    assert config.clusters == ("default",)
    assert config.nodes[0].cluster == "default"


@pytest.mark.parametrize(
    ("change", "field", "text"),
    [
        ({"clusters": ["EU"]}, "clusters[0]", "not a DNS label"),
        ({"clusters": ["eu", "eu"]}, "clusters", "named twice"),
        ({"clusters": []}, "clusters", "non-empty"),
        ({"nodes": [{"name": "x", "cluster": "asia", "gpus": []}]}, "nodes[0].cluster", "asia"),
        ({"nodes": [{"name": "x", "cluster": "a_b", "gpus": []}]}, "nodes[0].cluster", "DNS"),
        (
            {"offers": [{"name": "o", "kind": "gpu", "clusters": ["asia"]}]},
            "offers[0].clusters",
            "unknown cluster 'asia': the pool knows eu, us",
        ),
    ],
)
def test_bad_clusters_in_the_config_name_the_field(change, field, text):
    with pytest.raises(ConfigError) as e:
        parse_pool_config({**POOL, **change}, default_catalog())
    assert e.value.field == field and text in e.value.message


# -- agents ------------------------------------------------------------------------------------


def _inventory(cluster: str) -> dict:
    return {
        "cluster": cluster,
        "gpus": [{"uuid": "GPU-x1", "model": "NVIDIA H100 80GB HBM3", "memory_mib": 81559}],
    }


def test_an_agent_of_a_known_cluster_adds_its_node_there(store):
    store.put_inventory(node_from_inventory("us-2", _inventory("us"), store.catalog))
    pool = store.pool(detail=True)
    clusters = {c.name: {n.name for n in c.nodes} for c in pool.clusters or ()}
    assert clusters == {"eu": {"eu-1"}, "us": {"us-1", "us-2"}}


def test_an_agent_of_an_unknown_cluster_is_refused_with_the_known_list(store):
    before = store.pool(detail=True)
    with pytest.raises(StoreError) as e:
        store.put_inventory(node_from_inventory("asia-1", _inventory("asia"), store.catalog))
    err = e.value
    assert err.code == "unknown_cluster" and status_of(err) == 422
    assert err.field == "cluster" and err.allowed == ["eu", "us"]
    assert "the pool knows eu, us" in err.message
    assert store.pool(detail=True) == before  # nothing was added


# -- grants ------------------------------------------------------------------------------------


def test_a_hub_is_granted_only_in_its_clusters(store):
    us = store.allocate("alice", "", "h100", clusters=["us"])
    assert us.state == "granted" and us.node == "us-1" and us.cluster == "us"
    # the only us GPU is taken: a us hub waits although eu has one free
    waiting = store.allocate("bob", "", "h100", clusters=["us"])
    assert waiting.state == "queued" and waiting.cluster is None
    eu = store.allocate("carol", "", "h100", clusters=["eu"])
    assert eu.node == "eu-1" and eu.cluster == "eu"
    # the us GPU comes free: it goes to the us waiter
    store.release(us.id)
    assert store.lease(waiting.id).node == "us-1"


def test_a_hub_without_clusters_is_granted_anywhere(store):
    nodes = {store.allocate(u, "", "h100").node for u in ("alice", "bob")}
    assert nodes == {"eu-1", "us-1"}


def test_an_offer_restricted_to_a_cluster_is_placed_only_there(store):
    first = store.allocate("alice", "", "h100-eu")
    assert first.node == "eu-1"
    assert store.allocate("bob", "", "h100-eu").state == "queued"  # us-1 is free, not eu


def test_an_offer_a_hub_cannot_serve_is_refused_naming_where_it_runs(store):
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "", "h100-eu", clusters=["us"])
    assert e.value.code == "cluster_not_served" and status_of(e.value) == 422
    assert "runs in cluster(s) eu; this hub launches into us" in e.value.message
    assert e.value.allowed == ["h100"]


def test_a_hub_naming_an_unknown_cluster_is_refused(store):
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "", "h100", clusters=["asia"])
    assert e.value.code == "unknown_cluster" and e.value.allowed == ["eu", "us"]


def test_a_queued_request_keeps_its_clusters_across_a_restart(db_url, clock, store):
    store.allocate("alice", "", "h100", clusters=["us"])
    waiting = store.allocate("bob", "", "h100", clusters=["us"])
    hold_eu = store.allocate("carol", "", "h100", clusters=["eu"])
    again = make_store(db_url, clock, POOL)  # a new process: the allocator rebuilt from rows
    again.release(hold_eu.id)  # eu frees up: not for the us waiter
    assert again.lease(waiting.id).state == "queued"


def test_offers_for_a_hub_are_those_it_can_serve_counted_there(store):
    store.allocate("alice", "", "h100", clusters=["us"])
    us = {o["name"]: o for o in store.offers_for("bob", [], ["us"])}
    assert set(us) == {"h100"} and us["h100"]["available"] == 0
    eu = {o["name"]: o for o in store.offers_for("bob", [], ["eu"])}
    assert eu["h100"]["available"] == 1 and eu["h100-eu"]["available"] == 1
    assert eu["h100-eu"]["clusters"] == ["eu"]
    anywhere = {o["name"]: o["available"] for o in store.offers_for("bob", [])}
    assert anywhere == {"h100": 1, "h100-eu": 1}


# -- the local spawner -------------------------------------------------------------------------


def test_the_local_spawner_sees_a_lease_on_another_host():
    lease = {"node": "gpu-b", "slots": [{"gpu": "GPU-1", "kind": "gpu"}]}
    assert foreign_node(lease, ["gpu-a"]) == "gpu-b"
    assert foreign_node(lease, ["gpu-a", "gpu-b"]) is None
    assert foreign_node(lease, []) is None  # one machine: every node is this one
    assert foreign_node({"node": None, "slots": []}, ["gpu-a"]) is None  # CPU-only

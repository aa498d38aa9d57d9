"""A pool config's load in the store (SQLite and PostgreSQL): decided by ``pool.decide``
(``pool.rules.config``), the allocator following through effects, never a rebuild. After each
load it is what a rebuild from the rows gives: devices, leases, waiters, the offer table in
its rows' order, the quota book, the headroom, the node tallies and index, what is never
placeable, the budgets used, and the offers the demand weighs (their shapes, in order)."""

from __future__ import annotations

import copy
from fractions import Fraction
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import make_engine, upgrade
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.offertable import refresh_demand
from jupyterhub_gpupool.poolconfig import gpu_uuid, parse_pool_config
from jupyterhub_gpupool.service.ingest import node_from_inventory
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.errors import StoreError
from tests.allocrig import state_of
from tests.fakes import StoreClock

H0, H1 = gpu_uuid("h100", 0), gpu_uuid("h100", 1)
A100 = gpu_uuid("a100", 0)
POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "a100",
            "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}],
        },
        {"name": "h100", "cpu_milli": 64000, "gpus": [{"model": "H100-80GB", "count": 2}]},
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "cpu_milli": 4000},
    ],
    "quotas": {"default": {"guarantee": 4, "limit": 8}},
}


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    catalog = default_catalog()
    s = Store(make_engine(db_url), catalog, clock=clock, grant_timeout=300, mig_attempts=3)
    s.load_config(parse_pool_config(POOL, catalog))
    return s


def whole(alloc: Allocator) -> tuple:
    """What a decision reads of the allocator, derived caches included: ``state_of`` and the
    waiters, the offer table (in order), quotas, headroom, budgets used, what is never
    placeable for each offer, and the demand's offers and shapes."""
    never = {name: alloc._never_placeable(o) for name, o in alloc.offers.items()}
    target = alloc._rescore.demand if alloc._rescore is not None else alloc.demand
    return (
        state_of(alloc),
        sorted(
            (w.request.id, w.units, w.group, w.within_guarantee, w.reason)
            for w in alloc.waiters.values()
        ),
        list(alloc.offers.items()),
        (alloc.quotas.users, alloc.quotas.groups, alloc.quotas.default_user),
        {k: round(v, 6) for k, v in alloc.quotas.used_hours.items()},
        alloc.headroom,
        never,
        list(alloc._demand_weights),  # the values follow the counts at the last refresh
        target.bare,
        [(n.name, [g.uuid for g in n.gpus]) for n in alloc.nodes.values()],
    )


def load(store: Store, raw: dict[str, Any]) -> None:
    """Load ``raw``; the allocator is then what a rebuild from the rows gives (the rebuild
    given the demand counts learnt of the requests, which a rebuild starts at zero)."""
    store.load_config(parse_pool_config(raw, store.catalog))
    with store.locked() as alloc, store.read() as db:
        rebuilt = store._rebuild(db)
        rebuilt._demand_counts = dict(alloc._demand_counts)
        refresh_demand(rebuilt)
        assert whole(alloc) == whole(rebuilt)


def pool(**changes: Any) -> dict[str, Any]:
    out = copy.deepcopy(POOL)
    out.update(changes)
    return out


def with_h100(gpus: list[dict[str, Any]], **node: Any) -> list[dict[str, Any]]:
    return [POOL["nodes"][0], {"name": "h100", "cpu_milli": 64000, "gpus": gpus, **node}]


def released(store: Store, lease_id: str) -> str | None:
    lease = store.lease(lease_id)
    return lease.release_reason if lease.state == "released" else None


def test_an_offer_added_and_changed_follows_in_place(store):
    held = store.allocate("alice", "a", "h100")
    bigger = {"name": "h100", "kind": "gpu", "models": ["H100-80GB"], "cpu_milli": 16000}
    added = {"name": "h100x2", "kind": "gpu", "count": 2, "models": ["H100-80GB"]}
    load(store, pool(offers=[added, POOL["offers"][0], bigger]))
    with store.locked() as alloc:
        assert list(alloc.offers) == ["h100x2", "a100-1g", "h100"]
        assert alloc.nodes["h100"].cpu_used == 16000  # the lease counted as the offer is now
    assert store.lease(held.id).state == "granted"
    assert store.allocate("bob", "b", "h100x2").state == "queued"
    assert store.release(held.id).state == "released"


def test_an_offer_removed_ends_its_queued_requests_and_keeps_its_leases(store):
    first = store.allocate("alice", "a", "h100")
    second = store.allocate("bob", "b", "h100")
    waiting = store.allocate("carol", "c", "h100")
    assert waiting.state == "queued"
    load(store, pool(offers=[POOL["offers"][0]]))
    assert released(store, waiting.id) == "cancelled"
    assert "removed from the pool" in store.lease(waiting.id).message
    assert store.lease(first.id).state == store.lease(second.id).state == "granted"
    with store.locked() as alloc:
        assert alloc.nodes["h100"].cpu_used == 0  # a lease of no offer counts none
    store.release(first.id)
    with pytest.raises(StoreError):
        store.allocate("dan", "d", "h100")


def test_a_declared_node_added_serves_the_queue(store):
    store.allocate("alice", "a", "h100")
    store.allocate("bob", "b", "h100")
    waiting = store.allocate("carol", "c", "h100")
    extra = {"name": "h2", "gpus": [{"model": "H100-80GB", "count": 1}]}
    load(store, pool(nodes=[*POOL["nodes"], extra]))
    assert store.lease(waiting.id).state == "granted"
    assert store.lease(waiting.id).node == "h2"


def test_a_declared_node_replaced_keeps_its_leases_and_its_flags(store):
    held = store.allocate("alice", "a", "h100")
    store.set_node("h100", "cordon")
    load(store, pool(nodes=with_h100([{"model": "H100-80GB", "count": 2}], labels={"x": "y"})))
    assert store.lease(held.id).state == "granted"
    with store.locked() as alloc:
        node = alloc.nodes["h100"]
        assert node.cordoned and node.labels == {"x": "y"} and node.cpu_used == 4000


@pytest.mark.parametrize("kind", ["removed", "mig-switched"])
def test_a_declared_gpu_removed_or_switched_ends_its_lease_node_lost(store, kind):
    first = store.allocate("alice", "a", "h100")
    second = store.allocate("bob", "b", "h100")
    waiting = store.allocate("carol", "c", "h100")
    on = {
        store.lease(first.id).slots[0].gpu: first.id,
        store.lease(second.id).slots[0].gpu: second.id,
    }
    if kind == "removed":
        gpus = [{"model": "H100-80GB", "count": 1}]  # h100's GPU 1 is gone
    else:
        gpus = [{"model": "H100-80GB"}, {"model": "H100-80GB", "mig": {"enabled": True}}]
    load(store, pool(nodes=with_h100(gpus)))
    assert released(store, on[H1]) == "node-lost"
    assert released(store, on[H0]) is None
    assert store.lease(waiting.id).state == "queued"  # nothing freed it can have


def test_a_declared_node_removed_from_the_file_stays_as_its_rows_say(store):
    held = store.allocate("alice", "a", "a100-1g")
    load(store, pool(nodes=[POOL["nodes"][1]]))  # the file no longer names a100
    assert store.lease(held.id).state == "granted"
    with store.locked() as alloc:
        assert "a100" in alloc.nodes


def test_a_declared_gpu_s_blocked_creation_is_given_up(store):
    report = {
        "gpus": [
            {
                "uuid": A100,
                "index": 0,
                "model": "NVIDIA A100-SXM4-80GB",
                "memory_mib": 81920,
                "mig": {"enabled": True, "dynamic": True, "instances": []},
            }
        ]
    }
    store.put_inventory(node_from_inventory("a100", report, store.catalog))
    planned = store.allocate("alice", "a", "a100-1g")
    start = store.lease(planned.id).slots[0].start
    busy = {"profile": "7g.80gb", "start": 0, "uuid": "MIG-busy", "processes": 2}
    with store.transaction() as (db, _):  # the node's report says so, written by hand
        from jupyterhub_gpupool import orm

        gpu = db.query(orm.GpuRow).filter_by(uuid=A100).one()
        gpu.observed = [{**busy, "attempts": 0}]
    store._allocator = None  # rows written by hand: read them again
    load(store, POOL)
    assert released(store, planned.id) == "mig-failed"
    failed = [e for e in store.events(limit=100)[0] if e.kind == "mig-failed"]
    assert failed and failed[0].data["error"] == "Occupied"
    assert failed[0].data["start"] == start


def test_a_quota_and_a_price_changed_re_derive_borrowed_flags(store):
    first = store.allocate("alice", "a", "h100")
    second = store.allocate("alice", "b", "h100")
    assert not store.lease(second.id).borrowed
    prices = {"currency": "USD", "models": {"H100-80GB": {"held": 2, "busy": 1}}}
    load(store, pool(quotas={"users": {"alice": {"guarantee": 1, "limit": 8}}}, prices=prices))
    flags = {store.lease(i).borrowed for i in (first.id, second.id)}
    assert flags == {True, False}  # one of the two is beyond alice's guarantee now
    with store.locked() as alloc:
        assert alloc.quotas.users["alice"].guarantee == Fraction(1)
        assert alloc.quotas.default_user.guarantee == Fraction(0)  # the file has none now


def test_a_refused_config_changes_nothing(store):
    held = store.allocate("alice", "a", "h100")
    with store.locked() as alloc:
        before = whole(alloc)
    other = {"name": "other", "gpus": [{"uuid": H0, "model": "H100-80GB"}]}
    with pytest.raises(StoreError) as refused:
        load(store, pool(nodes=[*POOL["nodes"], other], offers=[]))
    assert refused.value.code == "gpu_elsewhere"
    with store.locked() as alloc:
        assert whole(alloc) == before
    assert [n.name for n in store.file_config.nodes] == [n["name"] for n in POOL["nodes"]]
    assert store.lease(held.id).state == "granted"


def test_the_headroom_follows_the_file(store):
    with store.locked() as alloc:
        assert alloc.headroom is None
    load(store, pool(borrowing={"keep_free": 1}))
    with store.locked() as alloc:
        assert alloc.headroom is not None and alloc.headroom.every == 1
    load(store, POOL)
    with store.locked() as alloc:
        assert alloc.headroom is None

"""An agent's inventory in the store (SQLite and PostgreSQL): decided by ``pool.decide``
(``pool.rules.inventory``), the allocator following through effects, never a rebuild. After
each report it is what a rebuild from the rows gives."""

from __future__ import annotations

from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import make_engine, upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import gpu_uuid, parse_pool_config
from jupyterhub_gpupool.service.ingest import node_from_inventory
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.errors import StoreError
from jupyterhub_gpupool.store.read.nodes import NodeView
from tests.allocrig import state_of
from tests.fakes import StoreClock

A100 = gpu_uuid("a100", 0)
POOL = {
    "nodes": [
        {
            "name": "a100",
            "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}],
        },
        {"name": "h100", "gpus": [{"model": "H100-80GB", "count": 2}]},
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
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


def h100(uuid: str, index: int, *, mig: bool = False) -> dict[str, Any]:
    gpu: dict[str, Any] = {"uuid": uuid, "index": index, "model": "NVIDIA H100 80GB HBM3"}
    gpu["memory_mib"] = 81559
    if mig:
        gpu["mig"] = {"enabled": True, "instances": []}
    return gpu


def a100(*instances: dict[str, Any]) -> dict[str, Any]:
    return {
        "uuid": A100,
        "index": 0,
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "mig": {"enabled": True, "dynamic": True, "instances": list(instances)},
    }


def report(store: Store, name: str, *gpus: dict[str, Any]) -> NodeView:
    """``name``'s agent reports these GPUs; the allocator is then what the rows say."""
    answer = store.put_inventory(node_from_inventory(name, {"gpus": list(gpus)}, store.catalog))
    with store.locked() as alloc, store.read() as db:
        assert state_of(alloc) == state_of(store._rebuild(db))
    return answer


def released(store: Store, lease_id: str) -> str | None:
    lease = store.lease(lease_id)
    return lease.release_reason if lease.state == "released" else None


def test_a_new_node_serves_the_queue_and_a_lost_gpu_ends_its_lease(store):
    h0, h1 = gpu_uuid("h100", 0), gpu_uuid("h100", 1)
    first = store.allocate("alice", "a", "h100")
    second = store.allocate("bob", "b", "h100")
    waiting = store.allocate("carol", "c", "h100")
    assert waiting.state == "queued"
    answer = report(store, "h2", h100("GPU-new", 0))
    assert answer.name == "h2" and answer.gpus == 1
    assert store.lease(waiting.id).node == "h2"
    on = {first.slots[0].gpu: first.id, second.slots[0].gpu: second.id}
    report(store, "h100", h100(h0, 0))  # h1 is gone: its lease holds nothing any more
    assert released(store, on[h1]) == "node-lost" and released(store, on[h0]) is None
    report(store, "h100", h100(h0, 0, mig=True))  # it switched to MIG under its lease
    assert released(store, on[h0]) == "node-lost"
    kinds = [e.kind for e in store.events(limit=100)[0]]
    assert kinds.count("inventory") == 3


def test_a_dynamic_gpu_s_instances_follow_its_reports(store):
    report(store, "a100", a100())
    made = store.allocate("alice", "a", "a100-1g")
    start = made.slots[0].start
    report(store, "a100", a100({"profile": "1g.10gb", "start": start, "uuid": "MIG-1"}))
    assert store.lease(made.id).ready is True
    store.keepalive(made.id)
    report(store, "a100", a100())  # the instance vanished under its bound lease
    assert released(store, made.id) == "node-lost"


def test_a_creation_a_busy_instance_blocks_is_given_up_at_once(store):
    report(store, "a100", a100())
    planned = store.allocate("alice", "a", "a100-1g")
    busy = {"profile": "7g.80gb", "start": 0, "uuid": "MIG-busy", "processes": 2}
    report(store, "a100", a100(busy))
    assert released(store, planned.id) == "mig-failed"
    failed = [e for e in store.events(limit=100)[0] if e.kind == "mig-failed"]
    assert failed and failed[0].data["error"] == "Occupied"


def test_an_inventory_is_refused_as_before(store):
    with pytest.raises(StoreError) as gone:
        report(store, "other", h100(gpu_uuid("h100", 0), 0))
    assert gone.value.code == "gpu_elsewhere" and gone.value.field == "uuid"
    node = node_from_inventory("x", {"cluster": "mars", "gpus": []}, store.catalog)
    with pytest.raises(StoreError) as unknown:
        store.put_inventory(node)
    assert unknown.value.code == "unknown_cluster" and unknown.value.allowed == ["default"]


def test_the_devices_are_every_gpu_whole_then_every_mig_instance(store):
    h0, h1 = gpu_uuid("h100", 0), gpu_uuid("h100", 1)
    assert store.devices() == [(A100, None), (h0, None), (h1, None)]
    report(store, "a100", a100({"profile": "1g.10gb", "start": 6, "uuid": "MIG-6"}))
    assert store.devices() == [(A100, None), (h0, None), (h1, None), (A100, 6)]

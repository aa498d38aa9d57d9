"""Dynamic MIG in the store (SQLite and PostgreSQL): plans, results, readiness and failures.

The node is played by hand here (inventories and results as an agent would send them); the
simulator plays it end to end in tests/integration/test_dynamic_mig.py.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import make_engine, upgrade
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.poolconfig import gpu_uuid, parse_pool_config
from jupyterhub_gpupool.service.ingest import node_from_inventory
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.mig import MigAction
from tests.allocrig import state_of
from tests.fakes import StoreClock

GPU = gpu_uuid("a100", 0)
POOL = {
    "nodes": [
        {
            "name": "a100",
            "gpus": [{"model": "A100-80GB", "mig": {"enabled": True, "dynamic": True}}],
        },
        {
            "name": "static",
            "gpus": [
                {
                    "model": "A100-80GB",
                    "mig": {"enabled": True, "instances": [{"profile": "3g.40gb", "start": 0}]},
                }
            ],
        },
        {"name": "h100", "gpus": [{"model": "H100-80GB"}]},
    ],
    "offers": [
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
        {"name": "a100-3g", "kind": "mig", "profile": "3g.40gb", "models": ["A100-80GB"]},
        {"name": "a100-7g", "kind": "mig", "profile": "7g.80gb", "models": ["A100-80GB"]},
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


def report(store: Store, *instances: dict[str, Any], dynamic: bool = True) -> None:
    """The a100 node's agent reports its GPU with these instances."""
    gpu = {
        "uuid": GPU,
        "index": 0,
        "model": "NVIDIA A100-SXM4-80GB",
        "memory_mib": 81920,
        "mig": {"enabled": True, "dynamic": dynamic, "instances": list(instances)},
    }
    store.put_inventory(node_from_inventory("a100", {"gpus": [gpu]}, store.catalog))


def done(action: MigAction) -> dict[str, Any]:
    """What the agent reports of ``action`` (its JSON, as it got it)."""
    return {"op": action.op, "gpu": action.gpu, "profile": action.profile, "start": action.start}


def create_ok(action: MigAction, uuid: str) -> dict[str, Any]:
    return {**done(action), "ok": True, "error": None, "mig_uuid": uuid}


def failed(action: MigAction, error: str) -> dict[str, Any]:
    return {**done(action), "ok": False, "error": error, "mig_uuid": None}


def kinds(store: Store, prefix: str = "mig-") -> list[tuple[str, str | None]]:
    items, _ = store.events(limit=1000)
    return [(e.kind, e.data.get("error")) for e in items if e.kind.startswith(prefix)]


def instances(store: Store, node: str = "a100") -> list[tuple]:
    pool = store.pool(detail=True)
    (found,) = [n for c in pool.clusters or () for n in c.nodes if n.name == node]
    return [(i.profile, i.start, i.uuid, i.state) for i in found.gpus[0].instances]


def test_a_grant_waits_for_its_instance_then_is_ready_with_a_fresh_expiry(store, clock):
    report(store)  # the node is there, empty
    lease = store.allocate("alice", "", "a100-1g")
    assert lease.state == "granted" and lease.ready is False
    (slot,) = lease.slots
    assert slot.mig_uuid is None
    (action,) = store.mig_plan("a100")
    assert action == MigAction("create", GPU, "1g.10gb", slot.start)
    assert instances(store) == [("1g.10gb", slot.start, None, "planned")]
    clock.advance(seconds=200)
    assert store.mig_results("a100", [create_ok(action, "MIG-new")]) == {"accepted": 1}
    ready = store.lease(lease.id)
    assert ready.ready is True and ready.slots[0].mig_uuid == "MIG-new"
    # the server gets the whole grant timeout from the moment the instance exists
    assert ready.expires == datetime(2026, 3, 2, 9, 8, 20)
    assert store.mig_plan("a100") == ()
    # the next inventory confirms it: nothing changes, no second event
    report(store, {"profile": "1g.10gb", "start": slot.start, "uuid": "MIG-new"})
    assert store.lease(lease.id).ready is True
    assert kinds(store) == [("mig-created", None)]
    assert store.mig_plan("a100") == ()


def test_whole_gpus_and_static_mig_are_ready_at_once(store):
    assert store.allocate("alice", "a", "h100").ready is True
    static = store.allocate("alice", "b", "a100-3g")
    assert static.node == "static" and static.ready is True
    assert static.slots[0].mig_uuid is None  # declared without uuid, still there
    assert store.mig_plan("static") == () and store.mig_plan("h100") == ()
    queued = store.allocate("alice", "c", "a100-3g")  # the static 3g is taken; dynamic GPU:
    assert queued.node == "a100" and queued.ready is False


def test_nothing_is_planned_for_a_node_that_never_reported(store):
    lease = store.allocate("alice", "", "a100-1g")
    assert lease.node == "a100" and lease.ready is False
    assert store.mig_plan("a100") == ()


def test_released_instance_stays_occupied_until_the_node_destroyed_it(store):
    report(store)
    lease = store.allocate("alice", "", "a100-1g")
    (action,) = store.mig_plan("a100")
    store.mig_results("a100", [create_ok(action, "MIG-1")])
    store.release(lease.id)
    start = action.start
    assert instances(store) == [("1g.10gb", start, "MIG-1", "retiring")]
    # the whole GPU is not free before the node destroyed the instance
    big = store.allocate("bob", "", "a100-7g")
    assert big.state == "queued"
    (destroy,) = store.mig_plan("a100")
    assert destroy == MigAction("destroy", GPU, "1g.10gb", start)
    store.mig_results("a100", [{**done(destroy), "ok": True, "error": None, "mig_uuid": None}])
    # destroyed: the memory is free and the queue is served in the same step
    promoted = store.lease(big.id)
    assert promoted.state == "granted" and promoted.ready is False
    assert store.mig_plan("a100") == (MigAction("create", GPU, "7g.80gb", 0),)
    assert ("mig-destroyed", None) in kinds(store)


def test_an_instance_with_processes_is_never_planned_for_destruction(store):
    report(store)
    lease = store.allocate("alice", "", "a100-1g")
    (action,) = store.mig_plan("a100")
    store.mig_results("a100", [create_ok(action, "MIG-1")])
    start = action.start
    report(store, {"profile": "1g.10gb", "start": start, "uuid": "MIG-1", "processes": 2})
    store.release(lease.id)
    assert store.mig_plan("a100") == ()
    assert instances(store) == [("1g.10gb", start, "MIG-1", "retiring")]
    # a process started after the last report: the agent refused (InUse), the pool waits
    report(store, {"profile": "1g.10gb", "start": start, "uuid": "MIG-1", "processes": 0})
    (destroy,) = store.mig_plan("a100")
    store.mig_results("a100", [failed(destroy, "InUse")])
    assert store.mig_plan("a100") == ()
    report(store, {"profile": "1g.10gb", "start": start, "uuid": "MIG-1", "processes": 0})
    assert store.mig_plan("a100") == (destroy,)


def test_failed_creation_is_told_retried_then_the_grant_released(store):
    report(store)
    lease = store.allocate("alice", "", "a100-1g")
    for attempt in (1, 2):
        (action,) = store.mig_plan("a100")
        store.mig_results("a100", [failed(action, "InsufficientResources")])
        seen = store.lease(lease.id)
        assert seen.state == "granted" and seen.ready is False
        assert "InsufficientResources" in seen.message
        assert f"attempt {attempt} of 3" in seen.message
    (action,) = store.mig_plan("a100")
    store.mig_results("a100", [failed(action, "InsufficientResources")])
    gone = store.lease(lease.id)
    assert gone.state == "released" and gone.release_reason == "mig-failed"
    assert "could not create" in gone.message and gone.ready is False
    assert store.mig_plan("a100") == () and instances(store) == []
    assert kinds(store) == [("mig-failed", "InsufficientResources")] * 3
    lease_events, _ = store.events(lease=lease.id)
    assert [e.kind for e in lease_events] == ["granted", *["mig-failed"] * 3, "released"]


def test_an_instance_made_for_a_grant_that_ended_meanwhile_is_destroyed(store):
    report(store)
    lease = store.allocate("alice", "", "a100-1g")
    (action,) = store.mig_plan("a100")
    store.release(lease.id)  # before the node's result came back
    assert store.mig_plan("a100") == ()
    store.mig_results("a100", [create_ok(action, "MIG-late")])
    assert store.mig_plan("a100") == (replace(action, op="destroy"),)
    # an inventory read in between does not take it back in
    report(store, {"profile": "1g.10gb", "start": action.start, "uuid": "MIG-late"})
    assert store.mig_plan("a100") == (replace(action, op="destroy"),)


def test_an_instance_found_in_the_way_is_destroyed_or_fails_the_grant_if_busy(store):
    report(store)
    lease = store.allocate("alice", "", "a100-7g")
    # somebody made an instance by hand before the pool's creation: idle, so planned away
    report(store, {"profile": "1g.10gb", "start": 3, "uuid": "MIG-hand", "processes": 0})
    assert [a.op for a in store.mig_plan("a100")] == ["destroy", "create"]
    assert store.lease(lease.id).state == "granted"
    # ... but busy: the creation can never succeed there, the grant is released at once
    report(store, {"profile": "1g.10gb", "start": 3, "uuid": "MIG-hand", "processes": 1})
    gone = store.lease(lease.id)
    assert gone.state == "released" and gone.release_reason == "mig-failed"
    assert ("mig-failed", "Occupied") in kinds(store)
    assert store.mig_plan("a100") == ()
    assert instances(store) == [("1g.10gb", 3, "MIG-hand", "retiring")]


def test_a_vanished_instance_loses_an_active_lease_but_a_grant_gets_it_again(store):
    report(store)
    active = store.allocate("alice", "a", "a100-1g")
    waiting = store.allocate("alice", "b", "a100-1g")
    made = {}
    for action in store.mig_plan("a100"):
        made[action.start] = f"MIG-{action.start}"
        store.mig_results("a100", [create_ok(action, made[action.start])])
    store.keepalive(active.id)
    report(store)  # both instances gone
    lost = store.lease(active.id)
    assert lost.state == "released" and lost.release_reason == "node-lost"
    again = store.lease(waiting.id)
    assert again.state == "granted" and again.ready is False
    (action,) = store.mig_plan("a100")
    assert (action.op, action.start) == ("create", again.slots[0].start)


def test_a_gpu_reported_static_is_never_planned_for(store):
    report(store, {"profile": "1g.10gb", "start": 0, "uuid": "MIG-s"}, dynamic=False)
    assert store.mig_plan("a100") == ()
    lease = store.allocate("alice", "", "a100-1g")
    assert lease.ready is True and lease.slots[0].mig_uuid == "MIG-s"


def test_a_restart_keeps_made_instances_and_what_is_planned(store, db_url, clock):
    report(store)
    made = store.allocate("alice", "a", "a100-1g")
    planned = store.allocate("alice", "b", "a100-1g")
    action = next(a for a in store.mig_plan("a100") if a.start == made.slots[0].start)
    store.mig_results("a100", [create_ok(action, "MIG-kept")])
    catalog = default_catalog()
    again = Store(make_engine(db_url), catalog, clock=clock, grant_timeout=300)
    again.load_config(parse_pool_config(POOL, catalog))
    assert again.lease(made.id).ready is True
    assert again.lease(made.id).slots[0].mig_uuid == "MIG-kept"
    assert again.lease(planned.id).state == "granted"
    assert [(a.op, a.start) for a in again.mig_plan("a100")] == [("create", planned.slots[0].start)]


def test_a_static_gpu_repartitioned_by_hand_is_taken_as_reported(store):
    report(store, {"profile": "3g.40gb", "start": 0, "uuid": "MIG-a"}, dynamic=False)
    report(store, {"profile": "1g.10gb", "start": 0, "uuid": "MIG-b"}, dynamic=False)
    assert instances(store) == [("1g.10gb", 0, "MIG-b", "present")]


def test_the_allocator_follows_mig_results_as_a_rebuild_from_the_rows_would(store):
    """A node's results change the allocator through their effects (the GPU's layout as the
    rows now say, the releases, the queue), never a rebuild: after each it is what the rows
    say."""

    def as_the_rows_say() -> None:
        with store.locked() as alloc, store.read() as db:
            assert state_of(alloc) == state_of(store._rebuild(db))

    report(store)
    kept = store.allocate("alice", "a", "a100-1g")
    ended = store.allocate("alice", "b", "a100-1g")
    made, late = store.mig_plan("a100")
    store.release(ended.id)  # its instance is made all the same: the pool no longer wants it
    store.mig_results("a100", [create_ok(made, "MIG-1"), create_ok(late, "MIG-late")])
    as_the_rows_say()
    assert store.lease(kept.id).ready is True
    big = store.allocate("bob", "", "a100-7g")
    assert big.state == "queued"
    store.release(kept.id)
    destroys = store.mig_plan("a100")
    assert {a.op for a in destroys} == {"destroy"} and len(destroys) == 2
    store.mig_results(
        "a100", [{**done(a), "ok": True, "error": None, "mig_uuid": None} for a in destroys]
    )
    assert store.lease(big.id).state == "granted"
    as_the_rows_say()
    for _ in range(3):
        (action,) = store.mig_plan("a100")
        store.mig_results("a100", [failed(action, "InsufficientResources")])
        as_the_rows_say()
    assert store.lease(big.id).state == "released"

"""One pool, several hubs: a lease keeps the hub it came from, reconcile with the pool's hub
touches only that hub's leases, and a spawner sees and acts on its own hub's leases only
(404 for another hub's, as for a missing lease); admins see every lease. Over HTTP through the
service's real tornado app and writer (the hub's token check played by a fake), on SQLite and
PostgreSQL. Two real hubs on one pool: ``tests/integration/test_two_hubs.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.app import PoolService
from jupyterhub_gpupool.service.scopes import ADMIN, RECLAIM, SPAWN, USE
from jupyterhub_gpupool.store import Store, StoreError
from tests.fakes import APPROVAL_POOL as POOL
from tests.fakes import InProcessService, StoreClock, make_store

US = "hub-us-spawner"

MODELS: dict[str, dict[str, Any]] = {
    "alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"], "groups": []},
    # a user of the pool's hub named like a user of the other hub
    "carol": {"kind": "user", "name": "carol", "scopes": [f"{USE}!user=carol"], "groups": []},
    # the pool's own hub's spawner, as configure_hub names it
    "eu": {"kind": "service", "name": "gpupool-spawner", "scopes": [SPAWN]},
    # another hub's spawner: a service of the pool's hub with the spawn scope
    "us": {"kind": "service", "name": US, "scopes": [SPAWN]},
    "reclaimer": {"kind": "service", "name": "gpupool-reclaimer", "scopes": [RECLAIM]},
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
}


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock)


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(db_url)
    with InProcessService(make_store(db_url, clock, POOL), MODELS) as service:
        yield service


def allocate(svc: InProcessService, who: str, user: str, offer: str = "h100") -> dict:
    r = svc.call(who, "POST", "allocations", {"user": user, "offer": offer})
    assert r.status == 201, r.body
    return r.json()


def ids(svc: InProcessService, who: str, path: str = "allocations") -> set[str]:
    r = svc.call(who, "GET", path)
    assert r.status == 200, r.body
    return {le["id"] for le in r.json()["items"]}


def test_a_lease_keeps_its_hub_and_reconcile_keeps_other_hubs_leases(store):
    own = store.allocate("alice", "", "a100-1g")
    other = store.allocate("bob", "", "a100-1g", hub=US)
    queued = store.allocate("carol", "", "a100-7g", hub=US)
    assert (own.hub, other.hub, queued.hub) == (None, US, US)
    assert queued.state == "queued"
    # the pool's hub runs none of these servers: only its own lease goes
    assert store.reconcile(set()) == 1
    assert store.lease(own.id).release_reason == "stopped"
    assert store.lease(other.id).state == "granted"
    assert store.lease(queued.id).state == "queued"
    items, _ = store.events()
    assert items[-1].kind == "reconciled" and items[-1].data == {"released": 1}
    # a resize target is its hub's too
    target = store.resize(other.id, "a100-3g")
    assert target.hub == US and target.resize_of == other.id
    # the listing filters by hub (None: the pool's own)
    listed, total = store.leases(hub=US)
    assert total == 3 and {le.id for le in listed} == {other.id, queued.id, target.id}
    assert {le.id for le in store.leases(hub=None)[0]} == {own.id}
    assert store.leases()[1] == 4


def test_a_server_held_through_another_hub_is_refused_without_its_lease(store):
    theirs = store.allocate("alice", "", "a100-1g", hub=US)
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "", "a100-1g")
    assert e.value.code == "already_allocated" and e.value.field == "server"
    assert "another hub" in e.value.message and "user names are the pool's keys" in e.value.message
    assert theirs.id not in e.value.message
    with pytest.raises(StoreError) as e:  # the same hub asking again is told which lease
        store.allocate("alice", "", "a100-1g", hub=US)
    assert theirs.id in e.value.message


def test_a_spawner_reaches_its_own_hubs_leases_only(svc):
    alices = allocate(svc, "eu", "alice")
    carols = allocate(svc, "us", "carol")
    assert (alices["hub"], carols["hub"]) == (None, US)

    # each spawner lists its own hub's leases (also with user=), the admin every hub's
    assert ids(svc, "eu") == {alices["id"]}
    assert ids(svc, "us") == {carols["id"]}
    assert ids(svc, "us", "allocations?user=alice") == set()
    assert ids(svc, "eu", "allocations?user=carol") == set()
    assert ids(svc, "root") == {alices["id"], carols["id"]}

    # another hub's lease is a 404, like a missing one, for every operation on it
    missing = "0" * 32
    for lease_id in (alices["id"], missing):
        for method, path, body in (
            ("GET", "allocations/{id}", None),
            ("DELETE", "allocations/{id}", None),
            ("POST", "allocations/{id}/keepalive", {}),
            ("POST", "allocations/{id}/resize", {"offer": "h100x2"}),
            ("POST", "allocations/{id}/restart", {}),
        ):
            r = svc.call("us", method, path.format(id=lease_id), body)
            assert r.status == 404, (method, path, r.body)
            assert r.json()["error"]["code"] == "not_found"
            assert r.json()["error"]["message"] == f"id: no lease {lease_id!r}"
        r = svc.call("us", "GET", f"utilization?lease={lease_id}")
        assert r.status == 404 and r.json()["error"]["field"] == "lease"
    r = svc.call("eu", "GET", f"allocations/{carols['id']}")
    assert r.status == 404
    # nothing happened to alice's lease; the spawners keep their powers on their own
    assert svc.call("root", "GET", f"allocations/{alices['id']}").json()["state"] == "granted"
    assert svc.call("eu", "POST", f"allocations/{alices['id']}/keepalive", {}).status == 200
    assert svc.call("us", "POST", f"allocations/{carols['id']}/keepalive", {}).status == 200
    assert svc.call("us", "GET", f"utilization?lease={carols['id']}").status == 200
    # the reclaimer reads every lease (it reads a shrink's target)
    assert svc.call("reclaimer", "GET", f"allocations/{carols['id']}").status == 200

    # a user's page through a spawner shows that hub's leases (quota and use are the user's)
    r = svc.call("us", "GET", "users/carol")
    assert [le["id"] for le in r.json()["leases"]] == [carols["id"]]
    assert [le["id"] for le in svc.call("us", "GET", "users/alice").json()["leases"]] == []
    # the pool's hub's carol is not the other hub's: none of its leases are hers
    assert svc.call("carol", "GET", "users/me").json()["leases"] == []
    assert ids(svc, "carol") == set()
    assert svc.call("carol", "GET", f"allocations/{carols['id']}").status == 404
    assert svc.call("carol", "DELETE", f"allocations/{carols['id']}").status == 404
    assert ids(svc, "alice") == {alices["id"]}

    # the other hub's spawner releases its own lease
    r = svc.call("us", "DELETE", f"allocations/{carols['id']}")
    assert r.status == 200 and r.json()["state"] == "released" and r.json()["hub"] == US


def test_a_server_held_by_another_hub_is_a_conflict_naming_no_lease(svc):
    alices = allocate(svc, "eu", "alice")
    r = svc.call("us", "POST", "allocations", {"user": "alice", "offer": "h100"})
    assert r.status == 409, r.body
    error = r.json()["error"]
    assert error["code"] == "already_allocated" and error["field"] == "server"
    assert "another hub" in error["message"] and alices["id"] not in error["message"]


def test_the_pools_own_spawners(monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_SERVICE_NAME", raising=False)
    assert PoolService().hub_spawners == ["gpupool-spawner"]
    monkeypatch.setenv("JUPYTERHUB_SERVICE_NAME", "pool")
    assert PoolService().hub_spawners == ["pool-spawner"]
    assert PoolService(hub_spawners=["a", "b"]).hub_spawners == ["a", "b"]

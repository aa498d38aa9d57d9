"""One live resize target per lease (issue 30): a second resize and a resize of the target are
refused (409), targets count toward the per-user cap, and a lease that ends takes its pending
target with it, except the target the service is restarting the server into."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.apihandlers.errors import status_of
from jupyterhub_gpupool.store import Store, StoreError
from tests.fakes import StoreClock, make_instances, make_store


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock, grant_timeout=300, max_requests_per_user=3)


def refusal(call, *args, **kw) -> tuple[int, str]:
    with pytest.raises(StoreError) as e:
        call(*args, **kw)
    return status_of(e.value), e.value.code


def test_a_lease_has_one_target_and_a_target_is_not_resized(store):
    old = store.allocate("alice", "", "h100")
    store.keepalive(old.id)
    target = store.resize(old.id, "a100-3g")
    assert target.state == "granted" and target.resize_of == old.id
    assert refusal(store.resize, old.id, "a100-1g") == (409, "resize_pending")
    assert refusal(store.resize, target.id, "a100-1g") == (409, "resize_target")
    live = [le for le in store.leases()[0] if le.state != "released"]
    assert {le.id for le in live} == {old.id, target.id}
    # once bound, the target is the server's lease: it may be resized like any other
    make_instances(store)
    store.keepalive(target.id)
    assert store.lease(old.id).release_reason == "resized"
    again = store.resize(target.id, "a100-1g")
    assert again.resize_of == target.id


def test_a_queued_target_is_the_one_target_too(store):
    holder = store.allocate("bob", "", "h100")
    old = store.allocate("alice", "", "a100-1g")
    queued = store.resize(old.id, "h100")
    assert queued.state == "queued"
    assert refusal(store.resize, old.id, "h100x2")[1] in ("resize_pending", "exceeds_node_size")
    assert refusal(store.resize, old.id, "a100-3g") == (409, "resize_pending")
    store.release(holder.id)


def test_targets_count_toward_the_per_user_cap(store):
    first = store.allocate("alice", "one", "a100-1g")
    store.allocate("alice", "two", "a100-1g")
    store.resize(first.id, "a100-3g")  # the third live request
    assert refusal(store.allocate, "alice", "three", "a100-1g") == (429, "too_many_requests")
    second = store.allocate("bob", "x", "a100-1g")
    store.allocate("bob", "y", "a100-1g")
    store.allocate("bob", "z", "a100-1g")
    assert refusal(store.resize, second.id, "h100") == (429, "too_many_requests")


def test_releasing_a_lease_releases_its_target(store):
    holder = store.allocate("bob", "", "h100")
    old = store.allocate("alice", "", "a100-1g")
    granted = store.resize(old.id, "a100-3g")
    store.release(old.id)
    gone = store.lease(granted.id)
    assert gone.state == "released" and gone.release_reason == "stopped"
    # a queued target leaves the queue
    again = store.allocate("alice", "", "a100-1g")
    queued = store.resize(again.id, "h100")
    assert queued.state == "queued"
    store.release(again.id, reason="admin")
    assert store.lease(queued.id).release_reason == "cancelled"
    store.release(holder.id)
    assert [le for le in store.leases()[0] if le.state != "released"] == []


def test_the_target_being_restarted_into_survives_the_stop(store):
    old = store.allocate("alice", "", "h100")
    store.keepalive(old.id)
    target = store.resize(old.id, "a100-3g")
    store.mark_restarting(target.id)
    store.release(old.id)  # the server's stop, on its way to restart into the target
    assert store.lease(target.id).state == "granted"

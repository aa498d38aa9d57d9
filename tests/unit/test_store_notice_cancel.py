"""An administrator's control of reclaim notices, in the store on SQLite and PostgreSQL: an
uncordon withdraws the drain notices of the node's leases (and no other notice), an admin
cancels a notice of any kind (audited, ``by_admin``), the idle count starts again and the next
idle notice waits the policy's ``extension`` (one hour by default), and what cannot be
cancelled says why (no notice; the reclaimer already acting)."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.reclaim import GpuSample, KernelView, PresenceView
from jupyterhub_gpupool.store import Store, StoreError
from jupyterhub_gpupool.store.read.events import EventView
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import StoreClock, make_instances, make_store

HOLDER = "reclaimer-1"
ADMIN = "user:admin"


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    store = make_store(db_url, clock)
    store.take_leader(HOLDER, 600)
    return store


def bound(store: Store, offer: str = "h100", user: str = "alice", server: str = "") -> LeaseView:
    lease = store.allocate(user, server, offer)
    if offer.startswith("a100"):
        make_instances(store)
    return store.keepalive(lease.id)


def idle_round(store: Store, clock: StoreClock, lease: LeaseView, minutes: float = 1) -> dict:
    """``minutes`` later, a round in which the GPU, the kernel and the user are all idle."""
    clock.advance(minutes=minutes)
    store.take_leader(HOLDER, 600)
    now = epoch(clock())
    gpu = lease.slots[0].gpu
    seen = {lease.id: (KernelView(now, "idle", None), PresenceView(now, None, 1))}
    samples = {(gpu, None): [GpuSample(now - 59, 0.0, 10), GpuSample(now, 0.0, 10)]}
    answer = store.reclaim_round(HOLDER, (now - 60, now), seen, samples)
    return {d.lease: d for d in answer.decisions}[lease.id]


def cancelled(store: Store, lease_id: str) -> list[EventView]:
    items, _ = store.events(lease=lease_id, kind="reclaim-cancelled")
    return items


def test_uncordon_withdraws_the_drain_notices_and_lists_them(store, clock):
    one = bound(store, "a100-1g", "alice", "one")
    two = bound(store, "a100-1g", "bob", "two")
    other = bound(store, "h100", "carol")
    store.admin_reclaim(other.id, grace=600, actor=ADMIN)  # another node, not a drain
    drained = store.drain_node("a100", clock() + timedelta(hours=2), actor=ADMIN)
    assert drained.noticed == 2
    out = store.set_node("a100", "uncordon", actor=ADMIN)
    assert not out.node.draining and not out.node.cordoned
    assert sorted(out.withdrawn or ()) == sorted([one.id, two.id])
    for lease in (one, two):
        now = store.lease(lease.id)
        assert now.state == "active" and now.reclaim is None
        [event] = cancelled(store, lease.id)
        assert event.actor == ADMIN
        assert event.data["by_admin"] and event.data["kind"] == "drain"
        assert "the node a100 is back in service" in event.data["reason"]
    assert store.lease(other.id).reclaim.kind == "admin"  # stands
    # an uncordon with nothing to withdraw says so, and a cordon has no such list
    assert store.set_node("a100", "uncordon", actor=ADMIN).withdrawn == ()
    assert store.set_node("a100", "cordon", actor=ADMIN).withdrawn is None


def test_uncordon_leaves_an_admin_notice_on_the_node(store, clock):
    lease = bound(store, "a100-1g", "alice")
    store.set_node("a100", "cordon", actor=ADMIN)
    store.admin_reclaim(lease.id, grace=600, actor=ADMIN)
    assert store.set_node("a100", "uncordon", actor=ADMIN).withdrawn == ()
    assert store.lease(lease.id).reclaim.kind == "admin"


def test_an_admin_cancels_an_admin_notice(store):
    lease = bound(store)
    store.admin_reclaim(lease.id, grace=600, actor=ADMIN)
    out = store.cancel_notice(lease.id, "  ", actor=ADMIN)
    assert out.state == "active" and out.reclaim is None
    [event] = cancelled(store, lease.id)
    assert event.data["kind"] == "admin" and event.data["by_admin"]
    assert event.data["reason"] == "an administrator (admin) withdrew the notice"
    # the user's page shows no notice any more, and says who withdrew it and why
    me = store.user("alice")
    assert me.notices == ()
    [told] = me.withdrawn
    assert (told.lease, told.kind, told.offer) == (lease.id, "admin", "h100")
    assert told.reason == "an administrator (admin) withdrew the notice"
    assert store.user("bob").withdrawn == ()


def test_a_cancelled_idle_notice_comes_again_only_after_the_extension(store, clock):
    """The default policy: 30 min idle, the notice 10 min ahead, extension 1 h."""
    lease = bound(store)
    rounds = 0
    while idle_round(store, clock, lease).kind != "notice":
        rounds += 1
        assert rounds < 60
    assert store.lease(lease.id).reclaim.kind == "idle"
    out = store.cancel_notice(lease.id, "she is on a call", actor=ADMIN)
    assert out.state == "active"
    assert cancelled(store, lease.id)[0].data["reason"] == "she is on a call"
    cancelled_at = clock()
    kinds = []
    while True:
        d = idle_round(store, clock, lease)
        kinds.append(d.kind)
        if d.kind == "notice":
            break
        assert len(kinds) < 120
    assert clock() - cancelled_at == timedelta(hours=1)  # held off for the extension
    assert set(kinds[:-1]) <= {"none"}


def test_what_cannot_be_cancelled_says_why(store, clock):
    lease = bound(store)
    with pytest.raises(StoreError) as e:
        store.cancel_notice(lease.id, actor=ADMIN)
    assert (e.value.code, e.value.field) == ("no_notice", "id")
    store.admin_reclaim(lease.id, grace=60, actor=ADMIN)
    clock.advance(seconds=61)
    assert idle_round(store, clock, lease, minutes=0).kind == "act"  # the reclaimer acts
    with pytest.raises(StoreError) as e:
        store.cancel_notice(lease.id, actor=ADMIN)
    assert e.value.code == "reclaim_in_progress"
    with pytest.raises(StoreError) as e:
        store.cancel_notice("no-such-lease", actor=ADMIN)
    assert e.value.code == "not_found"


def test_every_notice_carries_its_heading_and_whether_it_can_be_kept(store, clock):
    drained = bound(store, "a100-1g", "alice", "one")
    idle = bound(store, "h100", "bob")
    store.drain_node("a100", clock() + timedelta(hours=2), actor=ADMIN)
    rec = store.lease(drained.id).reclaim
    assert rec.heading == "Node maintenance: this GPU's node is being drained"
    assert rec.keep is False and rec.extendable is False
    assert "its node is drained for maintenance" in rec.why_not_kept
    rounds = 0
    while (d := idle_round(store, clock, idle)).kind != "notice":
        rounds += 1
        assert rounds < 60
    # the round's own answer (what the reclaimer's notify_hook gets) says the same
    assert d.notice_kind == "idle" and d.keep is True
    assert d.offer_name == "h100"  # STORE_POOL's offers have no display name of their own
    assert d.heading == "Idle GPU: it will be reclaimed" and d.why_not_kept is None
    rec = store.lease(idle.id).reclaim
    assert (rec.heading, rec.keep, rec.why_not_kept) == (d.heading, True, None)
    # the user's page lists both notices with the same words
    [mine] = store.user("alice").notices
    assert mine.lease == drained.id

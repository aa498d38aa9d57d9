"""The store on SQLite and PostgreSQL: lease lifecycle, queue promotion, expiry, reconcile,
resize, restart, accounting and the database's own no-double-grant guarantee."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from fractions import Fraction

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import make_engine, upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.service.apihandlers.errors import status_of
from jupyterhub_gpupool.store import Store, StoreError
from jupyterhub_gpupool.store.read.quotas import QuotaView
from tests.fakes import STORE_POOL as POOL
from tests.fakes import STORE_T0 as T0
from tests.fakes import StoreClock, make_instances, make_store
from tests.fakes import lease_events as events


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock, grant_timeout=300)


def test_lifecycle_granted_active_released(store, clock):
    lease = store.allocate("alice", "", "h100")
    assert lease.state == "granted" and lease.node == "h100"
    assert lease.expires == datetime(2026, 3, 2, 9, 5)
    clock.advance(seconds=30)
    active = store.keepalive(lease.id)
    assert active.state == "active" and active.activated == datetime(2026, 3, 2, 9, 0, 30)
    assert active.expires is None
    done = store.release(lease.id)
    assert done.state == "released" and done.release_reason == "stopped"
    assert all(s.gpu for s in done.slots)
    assert events(store, lease.id) == ["granted", "activated", "released"]
    # releasing twice is harmless and changes nothing
    assert store.release(lease.id).released == done.released


def test_release_promotes_the_waiter_in_the_same_transaction(store):
    first = store.allocate("alice", "", "h100")
    waiting = store.allocate("bob", "", "h100")
    assert waiting.state == "queued" and waiting.position == 1
    assert waiting.reason == "no_capacity"
    store.release(first.id)
    promoted = store.lease(waiting.id)
    assert promoted.state == "granted"
    assert promoted.slots[0].gpu == first.slots[0].gpu
    assert events(store, waiting.id) == ["queued", "granted"]


def test_unbound_grant_expires_and_frees_the_slice(store, clock):
    lease = store.allocate("alice", "", "h100")
    waiting = store.allocate("bob", "", "h100")
    clock.advance(seconds=299)
    assert store.expire_grants() == 0
    clock.advance(seconds=2)
    assert store.expire_grants() == 1
    assert store.lease(lease.id).release_reason == "expired"
    assert store.lease(waiting.id).state == "granted"


def test_active_lease_never_expires(store, clock):
    lease = store.allocate("alice", "", "h100")
    store.keepalive(lease.id)
    clock.advance(hours=10)
    assert store.expire_grants() == 0
    assert store.lease(lease.id).state == "active"


def test_reconcile_releases_servers_the_hub_no_longer_runs(store):
    kept = store.allocate("alice", "", "a100-1g")
    gone = store.allocate("bob", "gpu", "a100-1g")
    queued_gone = store.allocate("carol", "", "a100-7g")
    assert queued_gone.state == "queued"
    assert store.reconcile({("alice", "")}) == 2
    assert store.lease(kept.id).state == "granted"
    assert store.lease(gone.id).release_reason == "stopped"
    assert store.lease(queued_gone.id).release_reason == "cancelled"
    items, _ = store.events()
    assert items[-1].kind == "reconciled" and items[-1].data == {"released": 2}


def test_a_server_gets_one_lease(store):
    store.allocate("alice", "", "a100-1g")
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "", "a100-3g")
    assert status_of(e.value) == 409 and e.value.code == "already_allocated"
    assert store.allocate("alice", "other", "a100-1g").state == "granted"


def test_resize_is_make_before_break(store):
    old = store.allocate("alice", "", "a100-1g")
    with pytest.raises(StoreError) as e:  # dynamic MIG: nothing to bind before the node made it
        store.keepalive(old.id)
    assert (status_of(e.value), e.value.code) == (409, "not_ready")
    assert store.lease(old.id).state == "granted"
    make_instances(store)
    store.keepalive(old.id)
    new = store.resize(old.id, "a100-3g")
    assert new.state == "granted" and new.resize_of == old.id
    assert store.lease(old.id).state == "active"  # still has what she had
    make_instances(store)
    store.keepalive(new.id)  # the restarted server binds the new slice
    assert store.lease(old.id).release_reason == "resized"
    with pytest.raises(StoreError) as e:
        store.resize(new.id, "a100-3g")
    assert e.value.code == "same_offer" and status_of(e.value) == 422


def test_resize_that_cannot_be_met_keeps_the_old_lease(store):
    old = store.allocate("alice", "", "h100")
    before = store.leases()
    with pytest.raises(StoreError) as e:
        store.resize(old.id, "h100x2")  # the node has one H100
    assert e.value.code == "exceeds_node_size" and e.value.field == "count"
    assert store.leases() == before
    queued = store.resize(old.id, "a100-7g")  # possible, just not now? it is free: granted
    assert queued.state == "granted"
    with pytest.raises(StoreError) as e:
        store.resize(old.id, "a100-1g")
    assert e.value.code == "resize_pending"


def test_restart_rebuilds_the_same_occupancy(db_url, store, clock):
    a = store.allocate("alice", "", "a100-3g")
    b = store.allocate("bob", "", "a100-1g")
    store.allocate("carol", "", "a100-7g")  # queued behind them
    again = make_store(db_url, clock)
    c = again.allocate("dan", "", "a100-1g")
    taken = {(s.gpu, s.start) for le in (a, b) for s in le.slots}
    assert c.state == "granted"
    assert (c.slots[0].gpu, c.slots[0].start) not in taken
    with again.locked() as alloc:
        assert alloc.position(store.leases(user="carol")[0][0].id, 0) == 1


def test_two_replicas_never_double_grant(db_url, store, clock):
    other = make_store(db_url, clock)
    leases = []
    for i in range(8):
        s = store if i % 2 else other
        leases.append(s.allocate(f"u{i}", "", "a100-1g"))
    granted = [le for le in leases if le.state == "granted"]
    assert len(granted) == 7  # 7 × 1g on one A100
    assert len({s.start for le in granted for s in le.slots}) == 7


def test_database_refuses_a_second_live_holder(store, db_url):
    lease = store.allocate("alice", "", "h100")
    slot = lease.slots[0]
    engine = make_engine(db_url)
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(
            sa.insert(orm.LeaseRow).values(
                id="forged", user="mallory", offer="h100", state="granted", created=T0
            )
        )
        conn.execute(
            sa.insert(orm.LeaseSlotRow).values(
                lease_id="forged",
                slot_key=slot.gpu,
                gpu_uuid=slot.gpu,
                kind="gpu",
                milli=1000,
                create=False,
                live=True,
            )
        )


def test_quota_lowered_below_use_marks_borrowed(store):
    a = store.allocate("alice", "", "h100")
    b = store.allocate("alice", "nb2", "a100-3g")
    assert not store.lease(a.id).borrowed  # 1 unit within the guarantee of 1
    assert store.lease(b.id).borrowed
    store.put_quota("users", "alice", {"guarantee": 0.5, "limit": 4})
    assert store.lease(a.id).borrowed  # now beyond the new guarantee
    assert store.get_quota("users", "alice").source == "api"


def test_api_quota_wins_over_the_file(db_url, store, clock):
    pool = {**POOL, "quotas": {"users": {"alice": {"limit": 1}}}}
    store.put_quota("users", "alice", {"guarantee": 0, "limit": 3})
    make_store(db_url, clock, pool)
    assert store.get_quota("users", "alice").spec.limit == 3


def test_quota_reset_returns_to_the_file(db_url, clock):
    upgrade(db_url)
    pool = {**POOL, "quotas": {"users": {"alice": {"guarantee": 1, "limit": 1}}}}
    store = make_store(db_url, clock, pool)
    store.put_quota("users", "alice", {"guarantee": 0, "limit": 3})
    store.put_quota("users", "bob", {"limit": 0})
    assert store.reset_quota("users", "alice") == QuotaView(
        name="alice",
        kind="user",
        source="file",
        spec=QuotaSpec(
            guarantee=Fraction(1),
            limit=Fraction(1),
            budget=None,
            period="month",
            exception=None,
            budget_action="refuse",
            budget_minimum=Fraction(0),
        ),
    )
    assert store.reset_quota("users", "bob").source == "none"
    assert store.allocate("bob", "", "h100").state == "granted"  # bob's limit 0 is gone


def test_bad_quota_is_refused_unchanged(store):
    with pytest.raises(Exception) as e:
        store.put_quota("users", "alice", {"limit": -1})
    assert "quotas.users.alice.limit" in str(e.value)
    assert store.get_quota("users", "alice").source == "default"


def test_usage_matches_a_hand_computed_example(store, clock):
    # alice: H100 (1 unit) 09:00–11:00; bob: 3g.40gb (1/2) 10:00–13:00; carol: 1g.10gb (1/7)
    # from 09:00 until now (16:00). Window 10:00–12:00.
    alice = store.allocate("alice", "", "h100")
    carol = store.allocate("carol", "", "a100-1g")
    clock.advance(hours=1)
    bob = store.allocate("bob", "", "a100-3g")
    clock.advance(hours=1)
    store.release(alice.id)
    clock.advance(hours=2)
    store.release(bob.id)
    clock.advance(hours=3)
    rows = store.usage(T0 + timedelta(hours=1), T0 + timedelta(hours=3), "user")
    held = {r.key: r.figures.held for r in rows}
    assert held == {"alice": 1, "bob": 1, "carol": Decimal("0.285714")}  # 2/7
    by_offer = {r.key: r.figures.leases for r in store.usage(T0, clock(), "offer")}
    assert by_offer == {"h100": 1, "a100-3g": 1, "a100-1g": 1}
    assert store.lease(carol.id).state == "granted"


def test_usage_rejects_bad_arguments(store):
    with pytest.raises(StoreError) as e:
        store.usage(T0, T0 + timedelta(hours=1), "colour")
    assert e.value.field == "by" and e.value.allowed == ["user", "group", "offer", "job", "kernel"]
    with pytest.raises(StoreError) as e:
        store.usage(T0, T0, "user")
    assert e.value.field == "to"


def test_migrations_match_the_models(db_url):
    upgrade(db_url)
    engine = make_engine(db_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), orm.Base.metadata)
    assert diff == []


def test_migration_0012_drops_offer_keys_nothing_read(db_url, clock):
    """Offers stored before 0012 carry idle_timeout and reclaim_policy, which the offer parser
    now refuses: the upgrade strips them, so a store still loads an offer an admin made by API."""
    upgrade(db_url, "0011")
    engine = make_engine(db_url)
    old = {"name": "old-h100", "kind": "gpu", "models": ["H100-80GB"], "idle_timeout": 3600,
           "reclaim_policy": "stop"}  # fmt: skip
    with engine.begin() as conn:
        conn.execute(sa.insert(orm.OfferRow.__table__).values(
            name="old-h100", spec=old, source="api", position=9))  # fmt: skip
    upgrade(db_url)
    with engine.connect() as conn:
        spec = conn.execute(sa.select(orm.OfferRow.spec).where(orm.OfferRow.name == "old-h100"))
        assert spec.scalar_one() == {"name": "old-h100", "kind": "gpu", "models": ["H100-80GB"]}
    store = make_store(db_url, clock)
    assert store.allocate("alice", "", "old-h100").state == "granted"


def test_offer_removed_from_config_keeps_held_leases_and_ends_waiters(db_url, clock):
    upgrade(db_url)
    store = make_store(db_url, clock)
    held = store.allocate("alice", "", "h100")
    waiting = store.allocate("bob", "", "h100")
    assert (held.state, waiting.state) == ("granted", "queued")
    without = {**POOL, "offers": [o for o in POOL["offers"] if o["name"] != "h100"]}
    store = make_store(db_url, clock, pool=without)  # a restart with the offer gone
    assert store.lease(held.id).state == "granted"  # the holder keeps the GPU
    ended = store.lease(waiting.id)
    assert ended.state == "released" and ended.release_reason == "cancelled"
    assert "removed from the pool" in ended.message
    assert "h100" not in [o["name"] for o in store.offers_for("alice", [])]
    assert store.release(held.id).state == "released"
    assert store.allocate("carol", "", "a100-1g").state == "granted"
    with pytest.raises(StoreError) as info:
        store.allocate("carol", "x", "h100")
    assert status_of(info.value) == 422


def test_a_budget_runs_out_while_the_service_runs(db_url, clock):
    """Used budget hours are recounted as time passes, not only when the allocator is built."""
    upgrade(db_url)
    pool = {
        **POOL,
        "quotas": {
            "default": {"guarantee": 1, "limit": 4},
            "users": {"alice": {"guarantee": 1, "limit": 4, "budget": 2, "period": "day"}},
        },
    }
    store = make_store(db_url, clock, pool)
    assert store.user("alice").used_unit_hours == 0  # nothing used reads 0, not null
    first = store.allocate("alice", "a", "h100")  # 1 unit
    store.keepalive(first.id)
    clock.advance(minutes=90)
    second = store.allocate("alice", "b", "a100-1g")  # 1.5 of 2 hours used: still fine
    assert second.state == "granted"
    store.release(second.id)
    clock.advance(minutes=45)  # 2.25 hours used by the H100 alone
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "c", "a100-1g")
    assert (status_of(e.value), e.value.code) == (422, "budget_exhausted")  # as every quota's
    assert store.user("alice").used_unit_hours == pytest.approx(2.25)
    assert store.user("bob").used_unit_hours is None  # no budget applies to him
    assert store.allocate("bob", "", "a100-1g").state == "granted"  # others are unaffected
    # a new day, a new budget
    store.release(first.id)
    clock.advance(hours=24)
    assert store.allocate("alice", "d", "a100-1g").state == "granted"


def test_a_request_queued_and_granted_in_one_batch_is_granted_in_the_rows(db_url, clock):
    """A release later in a batch serves the queue, which holds a request the batch queued and
    has not written yet (a batch flushes at commit): the grant must reach the rows. It used to
    be made in memory only: the GPU held by nobody the rows knew, the request queued in them
    (and forgotten by the queue in memory) until a restart."""
    upgrade(db_url)
    store = make_store(db_url, clock)
    first = store.allocate("alice", "", "h100")  # the pool's one H100
    out = store.run_batch([commands.Allocate("bob", "", "h100"), commands.Release(first.id)])
    assert [r.state for r in out] == ["queued", "released"]
    lease = store.lease(out[0].id)
    assert lease.state == "granted" and [s.kind for s in lease.slots] == ["gpu"]
    assert events(store, out[0].id)[-1] == "granted"
    fresh = make_store(db_url, clock)  # what the rows say, rebuilt
    assert fresh.lease(out[0].id).state == "granted"
    assert fresh.allocate("carol", "", "h100").state == "queued"


@pytest.mark.parametrize(
    "gpus",
    [
        [{"model": "H100-80GB", "mig": {"enabled": True, "dynamic": True}}],  # mode switched
        [],  # the GPU is gone from the file
    ],
)
def test_a_config_load_that_takes_a_gpu_away_ends_its_lease_node_lost(db_url, clock, gpus):
    upgrade(db_url)
    store = make_store(db_url, clock)
    held = store.allocate("alice", "", "h100")
    mig = store.allocate("bob", "", "a100-1g")
    assert (held.state, mig.state) == ("granted", "granted")
    nodes = [n if n["name"] != "h100" else {**n, "gpus": gpus} for n in POOL["nodes"]]
    store = make_store(db_url, clock, pool={**POOL, "nodes": nodes})  # a restart, changed
    ended = store.lease(held.id)
    assert ended.state == "released" and ended.release_reason == "node-lost"
    assert store.lease(mig.id).state == "granted"  # another node's lease stays
    assert events(store, held.id)[-1] == "released"

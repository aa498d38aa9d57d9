"""The admin panel's writes in the store, on SQLite and PostgreSQL: reclaim now (a notice the
reclaimer's round acts on at its deadline, released ``admin``; or at once), extend a notice,
drain by a deadline (every lease noticed, a grant not bound released), a MIG re-partition that
waits for the leases in the way and then hands the dynamic node its new layout, the unit
history, and the audit log's new filters.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.errors import PoolError
from jupyterhub_gpupool.pool.reclaim import GpuSample, KernelView, PresenceView
from jupyterhub_gpupool.poolconfig import gpu_uuid
from jupyterhub_gpupool.store import Store, StoreError
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import StoreClock, make_instances, make_store
from tests.fakes import lease_events as events

HOLDER = "reclaimer-1"
A100 = gpu_uuid("a100", 0)


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    store = make_store(db_url, clock)
    store.take_leader(HOLDER, 600)
    return store


def bound(store: Store, offer: str = "h100", user: str = "alice", server: str = "") -> dict:
    lease = store.allocate(user, server, offer)
    if offer.startswith("a100"):
        make_instances(store)
    return store.keepalive(lease["id"])


def busy_round(store: Store, clock: StoreClock, lease: dict) -> dict:
    """A round in which the lease's GPU is busy and its user typing: nothing idle about it."""
    now = epoch(clock())
    seen = {lease["id"]: (KernelView(now, "busy", None), PresenceView(now, now - 1, 1))}
    gpu = lease["slots"][0]["gpu"]
    samples = {(gpu, None): [GpuSample(now - 30, 95.0, 1000), GpuSample(now, 95.0, 1000)]}
    answer = store.reclaim_round(HOLDER, (now - 60, now), seen, samples)
    return {d["lease"]: d for d in answer["decisions"]}[lease["id"]]


def test_reclaim_now_gives_notice_and_the_round_acts_at_the_deadline_even_on_a_busy_gpu(
    store, clock
):
    lease = bound(store)
    out = store.admin_reclaim(lease["id"], grace=300, actor="user:admin")
    assert out["state"] == "reclaiming"
    assert out["reclaim"]["kind"] == "admin" and not out["reclaim"]["extendable"]
    assert "user:admin" in out["reclaim"]["reason"]
    # the user cannot keep it
    with pytest.raises(StoreError) as e:
        store.keepalive(lease["id"], actor="user:alice")
    assert e.value.code == "not_extendable"
    assert busy_round(store, clock, lease)["kind"] == "noticed"  # a busy GPU does not cancel
    clock.advance(seconds=301)
    store.take_leader(HOLDER, 600)
    d = busy_round(store, clock, lease)
    assert d["kind"] == "act" and d["release_reason"] == "admin"
    done = store.reclaim_outcome(lease["id"], HOLDER, "done", saved=["a.ipynb"])
    assert done["state"] == "released" and done["release_reason"] == "admin"
    items, _ = store.events(lease=lease["id"], kind="reclaim-notice")
    assert [e["actor"] for e in items] == ["user:admin"]


def test_reclaim_immediately_releases_with_reason_admin(store):
    lease = bound(store)
    out = store.admin_reclaim(lease["id"], immediately=True, actor="user:admin")
    assert out["state"] == "released" and out["release_reason"] == "admin"
    with pytest.raises(StoreError) as e:
        store.admin_reclaim(lease["id"], actor="user:admin")
    assert e.value.code == "not_live"
    with pytest.raises(StoreError) as e:
        store.admin_reclaim("nope", actor="user:admin")
    assert e.value.code == "not_found"


def test_reclaim_now_refuses_bad_values_naming_the_field(store):
    lease = bound(store)
    for kw, field in (({"action": "explode"}, "action"), ({"grace": -1}, "grace")):
        with pytest.raises(StoreError) as e:
            store.admin_reclaim(lease["id"], **kw)
        assert e.value.field == field
    assert store.lease(lease["id"])["state"] == "active"  # nothing changed


def test_an_admin_extends_a_notice(store, clock):
    lease = bound(store)
    store.admin_reclaim(lease["id"], grace=60, actor="user:admin")
    before = store.lease(lease["id"])["reclaim"]["deadline"]
    out = store.extend_notice(lease["id"], 3600, actor="user:admin")
    assert out["reclaim"]["deadline"] > before
    assert out["reclaim"]["deadline"] == (clock() + timedelta(seconds=3660)).isoformat() + "Z"
    assert "reclaim-extended" in events(store, lease["id"])
    other = store.allocate("bob", "b", "h100")  # h100 taken: bob queues
    with pytest.raises(StoreError) as e:
        store.extend_notice(other["id"], 60)
    assert e.value.code == "no_notice"


def test_drain_by_a_deadline_notices_every_lease_and_releases_unbound_grants(store, clock):
    held = bound(store, "a100-1g", "alice", "one")
    grant = store.allocate("bob", "two", "a100-1g")
    make_instances(store)
    other = bound(store, "h100", "carol")
    deadline = clock() + timedelta(hours=2)
    out = store.drain_node("a100", deadline, actor="user:admin")
    assert out["draining"] and out["noticed"] == 1 and out["released"] == 1
    lease = store.lease(held["id"])
    assert lease["state"] == "reclaiming" and lease["reclaim"]["kind"] == "drain"
    assert lease["reclaim"]["deadline"] == deadline.isoformat() + "Z"
    assert store.lease(grant["id"])["release_reason"] == "admin"
    assert store.lease(other["id"])["state"] == "active"  # another node
    # nothing new lands there
    assert store.allocate("dave", "", "a100-1g")["state"] == "queued"
    with pytest.raises(StoreError) as e:
        store.drain_node("a100", clock() - timedelta(seconds=1))
    assert e.value.field == "deadline"


def test_repartition_preview_names_what_goes_comes_and_the_leases_in_the_way(store):
    held = bound(store, "a100-3g", "alice")
    start = held["slots"][0]["start"]
    plan = store.repartition_plan(
        "a100", A100, [{"profile": "1g.10gb", "start": s} for s in range(7)]
    )
    assert plan["method"] == "agent" and not plan["ready"]
    assert [h["lease"] for h in plan["in_way"]] == [held["id"]]
    assert {(g["profile"], g["start"]) for g in plan["go"]} == {("3g.40gb", start)}
    assert len(plan["come"]) == 7 and plan["mig_config"] == {"1g.10gb": 7}
    with pytest.raises(PoolError) as e:  # NVIDIA's rules: 1g.10gb cannot start at 7
        store.repartition_plan("a100", A100, [{"profile": "1g.10gb", "start": 7}])
    assert e.value.code == "invalid_mig_layout"
    with pytest.raises(PoolError) as e:
        store.repartition_plan("a100", A100, [{"profile": "1g.10gb"}])
    assert e.value.field == "layout[0].start"


def test_repartition_waits_for_the_lease_in_the_way_then_the_agent_gets_the_layout(store):
    held = bound(store, "a100-3g", "alice")
    layout = [{"profile": "1g.10gb", "start": s} for s in range(7)]
    rep = store.request_repartition("a100", A100, layout, actor="user:admin")
    assert rep["state"] == "waiting" and rep["plan"]["in_way"][0]["lease"] == held["id"]
    with pytest.raises(StoreError) as e:
        store.request_repartition("a100", A100, layout)
    assert e.value.code == "repartition_pending"
    # the GPU is cordoned meanwhile: a new ask queues rather than lands in the way
    assert store.allocate("bob", "", "a100-1g")["state"] == "queued"
    assert store.advance_repartitions() == 0
    store.release(held["id"])
    assert store.advance_repartitions() == 1
    [now] = store.repartitions(node="a100")
    assert now["state"] == "applying"
    plan = store.mig_plan("a100")
    assert {(a["profile"], a["start"]) for a in plan if a["op"] == "create"} == {
        ("1g.10gb", s) for s in range(7)
    }
    make_instances(store)  # the agent makes what the pool wants and reports it
    assert store.advance_repartitions() == 1
    [done] = store.repartitions(node="a100")
    assert done["state"] == "done"
    gpu = store.pool(detail=True)["clusters"][0]["nodes"][0]["gpus"][0]
    assert {(i["profile"], i["start"]) for i in gpu["instances"]} == {
        ("1g.10gb", s) for s in range(7)
    }
    assert all(i["state"] == "present" for i in gpu["instances"])
    assert not gpu["cordoned"]


def test_a_waiting_repartition_is_cancelled_and_notices_the_leases_in_the_way(store, clock):
    held = bound(store, "a100-3g", "alice")
    layout = [{"profile": "7g.80gb", "start": 0}]
    rep = store.request_repartition("a100", A100, layout, notice_seconds=600, actor="user:admin")
    lease = store.lease(held["id"])
    assert lease["state"] == "reclaiming" and lease["reclaim"]["kind"] == "admin"
    out = store.cancel_repartition(rep["id"], actor="user:admin")
    assert out["state"] == "cancelled"
    with pytest.raises(StoreError) as e:
        store.cancel_repartition(rep["id"])
    assert e.value.code == "repartition_applying"
    gpu = store.pool(detail=True)["clusters"][0]["nodes"][0]["gpus"][0]
    assert not gpu["cordoned"]


def test_unit_history_counts_held_and_queued_units(store, clock):
    start = clock()
    bound(store, "h100", "alice")
    clock.advance(minutes=30)
    waiting = store.allocate("bob", "", "h100")
    clock.advance(minutes=30)
    used, queued = store.unit_series(start, clock(), 900)
    assert used == [1.0] * 5  # held from the first sample on
    assert queued == [0.0, 0.0, 1.0, 1.0, 1.0]  # bob waits from the half hour on
    assert waiting["state"] == "queued"


def test_the_audit_log_filters_by_kind_and_time_newest_first(store, clock):
    lease = bound(store)
    clock.advance(minutes=5)
    store.release(lease["id"])
    items, total = store.events(kind="released")
    assert total == 1 and items[0]["lease"] == lease["id"]
    later, _ = store.events(since=clock() - timedelta(minutes=1))
    assert [e["kind"] for e in later] == ["released"]
    newest, _ = store.events(newest_first=True, limit=1)
    assert newest[0]["kind"] == "released"


def test_the_map_is_cached_until_the_pool_changes(store):
    version, body = store.map_view()
    assert store.map_view() == (version, body)  # nothing changed: the same text
    lease = bound(store)
    version2, body2 = store.map_view()
    assert version2 != version
    data = json.loads(body2)
    assert data["leases"][lease["id"]]["user"] == "alice"
    gpus = {g["uuid"]: g for c in data["clusters"] for n in c["nodes"] for g in n["gpus"]}
    held = gpus[lease["slots"][0]["gpu"]]
    assert held["holders"] == [{"lease": lease["id"], "kind": "gpu", "milli": 1000}]
    assert data["totals"]["used"] == 1.0 and gpus[A100]["memory_slices"] == 8

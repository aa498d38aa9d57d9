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
from jupyterhub_gpupool.service.serialize.poolmap import MapWriter
from jupyterhub_gpupool.store import Store, StoreError
from jupyterhub_gpupool.store.poolmap import MapParts
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.read.poolmap import MapHolderView
from jupyterhub_gpupool.store.read.reclaim import EnforcedNoticeView, ReclaimDecisionView
from jupyterhub_gpupool.store.rows import epoch
from tests.allocrig import state_of
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


def bound(store: Store, offer: str = "h100", user: str = "alice", server: str = "") -> LeaseView:
    lease = store.allocate(user, server, offer)
    if offer.startswith("a100"):
        make_instances(store)
    return store.keepalive(lease.id)


def busy_round(store: Store, clock: StoreClock, lease: LeaseView) -> ReclaimDecisionView:
    """A round in which the lease's GPU is busy and its user typing: nothing idle about it."""
    now = epoch(clock())
    seen = {lease.id: (KernelView(now, "busy", None), PresenceView(now, now - 1, 1))}
    gpu = lease.slots[0].gpu
    samples = {(gpu, None): [GpuSample(now - 30, 95.0, 1000), GpuSample(now, 95.0, 1000)]}
    answer = store.reclaim_round(HOLDER, (now - 60, now), seen, samples)
    return {d.lease: d for d in answer.decisions}[lease.id]


def test_reclaim_now_gives_notice_and_the_round_acts_at_the_deadline_even_on_a_busy_gpu(
    store, clock
):
    lease = bound(store)
    out = store.admin_reclaim(lease.id, grace=300, actor="user:admin")
    assert out.state == "reclaiming"
    assert out.reclaim.kind == "admin" and not out.reclaim.extendable
    assert "user:admin" in out.reclaim.reason
    # the user cannot keep it
    with pytest.raises(StoreError) as e:
        store.keepalive(lease.id, actor="user:alice")
    assert e.value.code == "not_extendable"
    assert busy_round(store, clock, lease).kind == "noticed"  # a busy GPU does not cancel
    clock.advance(seconds=301)
    store.take_leader(HOLDER, 600)
    d = busy_round(store, clock, lease)
    assert d.kind == "act" and d.release_reason == "admin"
    done = store.reclaim_outcome(lease.id, HOLDER, "done", saved=["a.ipynb"])
    assert done.state == "released" and done.release_reason == "admin"
    items, _ = store.events(lease=lease.id, kind="reclaim-notice")
    assert [e.actor for e in items] == ["user:admin"]


def test_reclaim_immediately_releases_with_reason_admin(store):
    lease = bound(store)
    out = store.admin_reclaim(lease.id, immediately=True, actor="user:admin")
    assert out.state == "released" and out.release_reason == "admin"
    with pytest.raises(StoreError) as e:
        store.admin_reclaim(lease.id, actor="user:admin")
    assert e.value.code == "not_live"
    with pytest.raises(StoreError) as e:
        store.admin_reclaim("nope", actor="user:admin")
    assert e.value.code == "not_found"


def test_reclaim_now_refuses_bad_values_naming_the_field(store):
    lease = bound(store)
    for kw, field in (({"action": "explode"}, "action"), ({"grace": -1}, "grace")):
        with pytest.raises(StoreError) as e:
            store.admin_reclaim(lease.id, **kw)
        assert e.value.field == field
    assert store.lease(lease.id).state == "active"  # nothing changed


def test_an_admin_extends_a_notice(store, clock):
    lease = bound(store)
    store.admin_reclaim(lease.id, grace=60, actor="user:admin")
    before = store.lease(lease.id).reclaim.deadline
    out = store.extend_notice(lease.id, 3600, actor="user:admin")
    assert out.reclaim.deadline > before
    assert out.reclaim.deadline == clock() + timedelta(seconds=3660)
    assert "reclaim-extended" in events(store, lease.id)
    other = store.allocate("bob", "b", "h100")  # h100 taken: bob queues
    with pytest.raises(StoreError) as e:
        store.extend_notice(other.id, 60)
    assert e.value.code == "no_notice"


def test_drain_by_a_deadline_notices_every_lease_and_releases_unbound_grants(store, clock):
    held = bound(store, "a100-1g", "alice", "one")
    grant = store.allocate("bob", "two", "a100-1g")
    make_instances(store)
    other = bound(store, "h100", "carol")
    deadline = clock() + timedelta(hours=2)
    out = store.drain_node("a100", deadline, actor="user:admin")
    assert out.node.draining and out.noticed == 1 and out.released == 1
    lease = store.lease(held.id)
    assert lease.state == "reclaiming" and lease.reclaim.kind == "drain"
    assert lease.reclaim.deadline == deadline
    assert store.lease(grant.id).release_reason == "admin"
    assert store.lease(other.id).state == "active"  # another node
    # nothing new lands there
    assert store.allocate("dave", "", "a100-1g").state == "queued"
    with pytest.raises(StoreError) as e:
        store.drain_node("a100", clock() - timedelta(seconds=1))
    assert e.value.field == "deadline"


SERVICE = "service:gpupool"


def test_an_overdue_drain_notice_is_claimed_by_the_service_and_released_admin(store, clock):
    held = bound(store, "h100", "alice", "one")
    idle = bound(store, "a100-1g", "bob", "idle")
    store.admin_reclaim(idle.id, grace=60, actor="user:admin")  # an admin notice: enforced
    deadline = clock() + timedelta(minutes=10)
    store.drain_node("h100", deadline, actor="user:admin")
    version = store.map_view().version
    assert store.enforce_notices(120, actor=SERVICE) == []  # before the deadline: nothing
    clock.advance(minutes=11)  # past both deadlines, by less than 120 s for the drain
    assert store.map_view().version == version  # nothing written: the pool version stays
    claimed = store.enforce_notices(120, actor=SERVICE)
    assert [c.lease for c in claimed] == [idle.id]  # 10 min past; the drain 1 min
    clock.advance(seconds=61)
    claimed = store.enforce_notices(120, actor=SERVICE)
    assert claimed == [
        EnforcedNoticeView(
            lease=held.id,
            user="alice",
            server="one",
            kind="drain",
            action="stop",
            deadline=deadline,
            reason="the node h100 is drained for maintenance by " + deadline.isoformat() + "Z",
        )
    ]
    assert store.enforce_notices(120, actor=SERVICE) == []  # claimed: not handed out twice
    lease = store.lease(held.id)
    assert lease.reclaim.acting and not lease.reclaim.extendable
    with pytest.raises(StoreError) as e:  # the user cannot keep it any more
        store.keepalive(held.id, actor="user:alice")
    assert e.value.code in ("reclaim_in_progress", "not_extendable")
    # the server's stop (the spawner's release) says why the lease ended
    assert store.release(held.id, reason="stopped").release_reason == "admin"
    done = store.notice_enforced(held.id, True, actor=SERVICE)
    assert done.state == "released" and done.release_reason == "admin"
    # the server already gone: the service's report releases it, reason admin
    out = store.notice_enforced(idle.id, True, actor=SERVICE)
    assert out.state == "released" and out.release_reason == "admin"
    acting, _ = store.events(lease=held.id, kind="reclaim-acting")
    assert [e.actor for e in acting] == [SERVICE]
    assert "no reclaimer carried out the drain notice within 120 s" in acting[0].data["enforced"]
    reclaimed, _ = store.events(lease=held.id, kind="reclaimed")
    assert reclaimed[0].actor == SERVICE and reclaimed[0].data["outcome"] == "done"
    with pytest.raises(StoreError) as e:
        store.notice_enforced(held.id, True)
    assert e.value.code == "not_acting"


def test_the_service_leaves_a_notice_a_reclaimer_acts_on_and_idle_notices_alone(store, clock):
    lease = bound(store)
    store.admin_reclaim(lease.id, grace=60, actor="user:admin")
    clock.advance(seconds=61)
    store.take_leader(HOLDER, 600)
    assert busy_round(store, clock, lease).kind == "act"  # the reclaimer claims it
    clock.advance(seconds=600)
    assert store.enforce_notices(60, actor=SERVICE) == []  # it is the reclaimer's
    # a claim older than reclaim_claim_timeout: the reclaimer died mid-action
    clock.advance(seconds=store.reclaim_claim_timeout)
    assert [c.lease for c in store.enforce_notices(60, actor=SERVICE)] == [lease.id]
    # the hub could not stop the server: the claim stays (tried again after the timeout)
    failed = store.notice_enforced(lease.id, False, "the hub answered 503", actor=SERVICE)
    assert failed.state == "reclaiming" and failed.reclaim.acting
    assert store.enforce_notices(60, actor=SERVICE) == []
    assert "reclaim-failed" in events(store, lease.id)
    with pytest.raises(StoreError) as e:
        store.enforce_notices(-1)
    assert e.value.field == "overdue"


def test_an_idle_notice_past_its_deadline_stays_the_reclaimers(store, clock):
    """It needs the lab's save-all first, which only the reclaimer does."""
    lease = bound(store)
    gpu = lease.slots[0].gpu
    for _ in range(300):  # rounds a minute apart: an idle GPU, an idle kernel, nobody there
        clock.advance(minutes=1)
        store.take_leader(HOLDER, 600)
        now = epoch(clock())
        seen = {lease.id: (KernelView(now, "idle", None), PresenceView(now, None, 1))}
        samples = {(gpu, None): [GpuSample(now - 59, 0.0, 10), GpuSample(now, 0.0, 10)]}
        store.reclaim_round(HOLDER, (now - 60, now), seen, samples)
        if store.lease(lease.id).state == "reclaiming":
            break
    notice = store.lease(lease.id).reclaim
    assert notice.kind == "idle"
    clock.advance(days=1)
    assert store.enforce_notices(0, actor=SERVICE) == []


def test_repartition_preview_names_what_goes_comes_and_the_leases_in_the_way(store):
    held = bound(store, "a100-3g", "alice")
    start = held.slots[0].start
    plan = store.repartition_plan(
        "a100", A100, [{"profile": "1g.10gb", "start": s} for s in range(7)]
    )
    assert plan.method == "agent" and not plan.plan.ready
    assert [h.lease for h in plan.plan.in_way] == [held.id]
    assert {(g.profile, g.start) for g in plan.plan.go} == {("3g.40gb", start)}
    assert plan.plan.come == [("1g.10gb", s) for s in range(7)]
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
    assert rep.state == "waiting" and rep.plan.in_way[0].lease == held.id
    with pytest.raises(StoreError) as e:
        store.request_repartition("a100", A100, layout)
    assert e.value.code == "repartition_pending"
    # the GPU is cordoned meanwhile: a new ask queues rather than lands in the way
    assert store.allocate("bob", "", "a100-1g").state == "queued"
    assert store.advance_repartitions() == 0
    store.release(held.id)
    assert store.advance_repartitions() == 1
    [now] = store.repartitions(node="a100")
    assert now.state == "applying"
    actions = store.mig_plan("a100")
    assert {(a.profile, a.start) for a in actions if a.op == "create"} == {
        ("1g.10gb", s) for s in range(7)
    }
    make_instances(store)  # the agent makes what the pool wants and reports it
    assert store.advance_repartitions() == 1
    [done] = store.repartitions(node="a100")
    assert done.state == "done"
    gpu = store.pool(detail=True).clusters[0].nodes[0].gpus[0]
    assert {(i.profile, i.start) for i in gpu.instances} == {("1g.10gb", s) for s in range(7)}
    assert all(i.state == "present" for i in gpu.instances)
    assert not gpu.cordoned


def test_a_waiting_repartition_is_cancelled_and_notices_the_leases_in_the_way(store, clock):
    held = bound(store, "a100-3g", "alice")
    layout = [{"profile": "7g.80gb", "start": 0}]
    rep = store.request_repartition("a100", A100, layout, notice_seconds=600, actor="user:admin")
    lease = store.lease(held.id)
    assert lease.state == "reclaiming" and lease.reclaim.kind == "admin"
    out = store.cancel_repartition(rep.id, actor="user:admin")
    assert out.state == "cancelled"
    with pytest.raises(StoreError) as e:
        store.cancel_repartition(rep.id)
    assert e.value.code == "repartition_applying"
    gpu = store.pool(detail=True).clusters[0].nodes[0].gpus[0]
    assert not gpu.cordoned


def test_unit_history_counts_held_and_queued_units(store, clock):
    start = clock()
    bound(store, "h100", "alice")
    clock.advance(minutes=30)
    waiting = store.allocate("bob", "", "h100")
    clock.advance(minutes=30)
    series = store.unit_series(start, clock(), 900)
    assert series.used == (1.0,) * 5  # held from the first sample on
    assert series.queued == (0.0, 0.0, 1.0, 1.0, 1.0)  # bob waits from the half hour on
    assert waiting.state == "queued"


def test_the_audit_log_filters_by_kind_and_time_newest_first(store, clock):
    lease = bound(store)
    clock.advance(minutes=5)
    store.release(lease.id)
    items, total = store.events(kind="released")
    assert total == 1 and items[0].lease == lease.id
    later, _ = store.events(since=clock() - timedelta(minutes=1))
    assert [e.kind for e in later] == ["released"]
    newest, _ = store.events(newest_first=True, limit=1)
    assert newest[0].kind == "released"


def test_the_map_is_cached_until_the_pool_changes(store):
    view = store.map_view()
    assert store.map_view() is view  # nothing changed: the same view
    lease = bound(store)
    after = store.map_view()
    assert after.version != view.version
    (shown,) = [le for le in after.leases if le.id == lease.id]
    assert (shown.user, shown.workload, shown.job, shown.notice) == (
        "alice",
        "interactive",
        None,
        None,
    )
    gpus = {g.uuid: g for c in after.clusters for n in c.nodes for g in n.gpus}
    held = gpus[lease.slots[0].gpu]
    assert held.holders == (MapHolderView(lease.id, "gpu", 1000),)
    assert after.totals.used == 1.0 and gpus[A100].memory_slices == 8


def test_a_map_rebuilt_from_its_unchanged_parts_is_the_text_of_a_fresh_build(store, clock):
    """After each change the map reuses the view of every GPU and lease that did not change
    (``poolmap.MapParts``: a node none of whose GPUs changed too) and the writer their text
    (``serialize.poolmap.MapWriter``); it must be, byte for byte, what a build from nothing
    writes."""
    writer = MapWriter()

    def fresh() -> str:
        kept = store._map_parts, store._map_cache
        store._map_parts, store._map_cache = MapParts(), None  # a build from nothing
        try:
            return MapWriter().text(store.map_view())
        finally:
            store._map_parts, store._map_cache = kept

    one = bound(store, "a100-1g", "alice", "one")
    two = bound(store, "a100-3g", "bob", "two")
    whole = bound(store, "h100", "carol")
    view = store.map_view()
    writer.text(view)
    changes = [
        lambda: store.allocate("dave", "", "a100-1g"),  # a grant: a planned instance
        lambda: make_instances(store),  # the instances exist
        lambda: store.admin_reclaim(one.id, grace=600, actor="user:admin"),  # a notice
        lambda: store.set_node("h100", "cordon", actor="user:admin"),
        lambda: store.release(whole.id),
        lambda: store.request_repartition(
            "a100", A100, [{"profile": "7g.80gb", "start": 0}], actor="user:admin"
        ),
        lambda: store.release(two.id),
        lambda: clock.advance(minutes=5),  # times move, nothing else: the text stays
    ]
    for change in changes:
        before = {n.name: n for c in view.clusters for n in c.nodes}
        change()
        view = store.map_view()
        kept = [n.name for c in view.clusters for n in c.nodes if n is before[n.name]]
        assert kept, change  # the node of the GPU that did not change is the same view
        body = writer.text(view)
        assert store._map_parts.built[0] <= 1  # each touches one GPU: the other is reused
        assert writer.encoded[0] <= 1  # and so is the other node, and its text
        assert body == fresh(), change
        assert store.map_view() is view  # and kept until the next change
        assert writer.text(view) is body
    assert json.loads(body)["leases"][one.id]["notice"]["kind"] == "admin"


def test_a_repartition_leaves_the_allocator_as_a_rebuild_from_its_rows_would(store):
    """The allocator follows a re-partition through its effects (the GPU's cordon, the layout
    written, the notice's release), never a rebuild: at each step it is what the rows say."""

    def as_the_rows_say() -> None:
        with store.locked() as alloc, store.read() as db:
            assert state_of(alloc) == state_of(store._rebuild(db))

    held = bound(store, "a100-3g", "alice")
    granted = store.allocate("bob", "", "a100-3g")  # not bound yet: the notice releases it
    assert granted.state == "granted"
    layout = [{"profile": "1g.10gb", "start": s} for s in range(7)]
    store.request_repartition("a100", A100, layout, notice_seconds=600, actor="user:admin")
    assert store.lease(granted.id).state == "released"
    as_the_rows_say()
    store.release(held.id)
    assert store.advance_repartitions() == 1
    as_the_rows_say()
    make_instances(store)
    assert store.advance_repartitions() == 1
    as_the_rows_say()

"""Approvals in the store, on SQLite and PostgreSQL: an offer that needs an administrator's
approval, quota exceptions up to a ceiling, approve (shorter, smaller), deny, withdraw, the
409s on a request no longer waiting, and the lapse of approved time (a notice first, then the
reclaim round ends the lease ``lapsed``; a request still queued is ``lapsed`` at once).
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.pool.reclaim import GpuSample, KernelView, PresenceView
from jupyterhub_gpupool.store import Store, StoreError
from jupyterhub_gpupool.store.read.leases import LeaseView
from jupyterhub_gpupool.store.read.reclaim import ReclaimDecisionView
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import APPROVAL_POOL as POOL
from tests.fakes import StoreClock, make_store
from tests.fakes import lease_events as events

HOLDER = "reclaimer-1"
HOUR = 3600.0


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    store = make_store(db_url, clock, POOL)
    store.take_leader(HOLDER, 600)
    return store


def refused(call, *args, **kwargs) -> StoreError:
    with pytest.raises(StoreError) as e:
        call(*args, **kwargs)
    return e.value


def quiet_round(store: Store, clock: StoreClock, lease: LeaseView) -> ReclaimDecisionView:
    """A reclaim round with the lease's GPU busy and its user typing."""
    now = epoch(clock())
    seen = {lease.id: (KernelView(now, "busy", None), PresenceView(now, now - 1, 1))}
    samples = {
        (s.gpu, None): [GpuSample(now - 30, 95.0, 1000), GpuSample(now, 95.0, 1000)]
        for s in lease.slots
    }
    store.take_leader(HOLDER, 600)
    answer = store.reclaim_round(HOLDER, (now - 60, now), seen, samples)
    return {d.lease: d for d in answer.decisions}[lease.id]


# -- an offer that needs approval ---------------------------------------------------------


def test_an_offer_needing_approval_waits_holding_nothing_until_approved(store):
    e = refused(store.allocate, "admin", "", "big")
    assert (e.code, e.field) == ("missing_field", "reason")
    ask = store.allocate("admin", "", "big", reason="  the paper deadline  ", actor="user:admin")
    assert ask.state == "awaiting_approval" and ask.slots == () and not ask.ready
    assert ask.approval["reason"] == "the paper deadline"
    assert ask.approval["required_by"] == ["offer"] and ask.approval["decision"] is None
    # nothing is held meanwhile: somebody else takes a GPU, and it is in nobody's queue
    other = store.allocate("alice", "", "h100")
    assert other.state == "granted"
    assert [lease.id for lease in store.awaiting_approval()] == [ask.id]
    # one request per server, awaiting ones too
    assert refused(store.allocate, "admin", "", "h100").code == "already_allocated"
    store.release(other.id)
    out = store.approve(ask.id, note="go ahead", actor="user:root")
    assert out.state == "granted" and len(out.slots) == 4
    assert out.approval["decision"] == "approved"
    assert out.approval["decided_by"] == "user:root" and out.approval["note"] == "go ahead"
    assert out.lapses is None  # no duration asked, none to lapse
    assert events(store, ask.id) == ["approval-requested", "approved", "granted"]
    assert store.awaiting_approval() == []


def test_an_approved_request_joins_the_queue_when_the_hardware_is_busy(store):
    held = store.allocate("admin", "x", "h100")
    ask = store.allocate("admin", "", "big", reason="training")
    out = store.approve(ask.id, actor="user:root")
    assert out.state == "queued" and out.position == 1
    store.release(held.id)
    assert store.lease(ask.id).state == "granted"


def test_deny_ends_the_request_with_the_admins_reason(store):
    ask = store.allocate("admin", "", "big", reason="training")
    e = refused(store.deny, ask.id, "   ")
    assert (e.code, e.field) == ("missing_field", "reason")
    out = store.deny(ask.id, "use the 2-GPU offer", actor="user:root")
    assert out.state == "released" and out.release_reason == "denied"
    assert out.approval["decision"] == "denied"
    assert out.approval["note"] == "use the 2-GPU offer"
    assert "use the 2-GPU offer" in out.message
    for call, args in ((store.approve, ()), (store.deny, ("again",))):
        e = refused(call, ask.id, *args)
        assert e.code == "not_awaiting_approval" and "denied" in e.message
    assert events(store, ask.id) == ["approval-requested", "denied", "released"]


def test_a_withdrawn_request_cannot_be_approved(store):
    ask = store.allocate("admin", "", "big", reason="training")
    out = store.release(ask.id, actor="user:admin")
    assert out.release_reason == "withdrawn"
    e = refused(store.approve, ask.id)
    assert e.code == "not_awaiting_approval" and "withdrawn" in e.message
    # a request already granted is not awaiting either
    granted = store.allocate("alice", "", "h100")
    assert refused(store.approve, granted.id).code == "not_awaiting_approval"


def test_a_request_refused_for_hardware_is_refused_even_with_a_reason(store):
    e = refused(store.allocate, "admin", "", "nonexistent", reason="please")
    assert e.code == "unknown_offer"


# -- quota exceptions --------------------------------------------------------------------


def test_an_exception_beyond_the_limit_waits_and_is_held_to_the_ceiling_once_approved(store):
    e = refused(store.allocate, "alice", "", "h100x2")
    assert e.code == "exceeds_limit" and "exception up to 2 units" in e.message
    e = refused(store.allocate, "alice", "", "h100x2", reason="deadline")
    assert (e.code, e.field) == ("missing_field", "duration")
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=7 * 86400)
    assert ask.state == "awaiting_approval" and ask.exception
    assert ask.approval["required_by"] == ["quota"] and ask.approval["ceiling"] == 2.0
    assert ask.units == 2.0
    out = store.approve(ask.id, duration=3 * 86400, actor="user:root")
    assert out.state == "granted" and out.units == 2.0
    assert out.approval["approved_duration"] == 3 * 86400
    assert out.lapses is not None
    # the exception is this request's alone: another server of hers is over her limit
    other = store.allocate("alice", "b", "h100")
    assert other.state == "queued" and other.reason == "quota"


def test_an_exception_beyond_the_ceiling_is_refused_naming_it(store):
    e = refused(store.allocate, "alice", "", "h100x4", reason="deadline", duration=HOUR)
    assert e.code == "exceeds_exception_ceiling" and e.allowed == [2.0]
    assert "ceiling of 2 units" in e.message
    # a quota without a ceiling allows no exceptions, and says so
    e = refused(store.allocate, "carol", "", "h100x2", reason="deadline", duration=HOUR)
    assert e.code == "exceeds_limit" and "allows exceptions" in e.message


def test_an_approval_may_only_shorten_the_duration_and_lower_the_offer(store):
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=HOUR)
    e = refused(store.approve, ask.id, duration=2 * HOUR)
    assert (e.code, e.field) == ("invalid_field", "duration")
    e = refused(store.approve, ask.id, offer="h100x4")
    assert (e.code, e.field) == ("invalid_field", "offer") and e.allowed == ["h100"]
    e = refused(store.approve, ask.id, offer="cpu")
    assert e.code == "invalid_field"
    assert refused(store.approve, ask.id, offer="nope").code == "unknown_offer"
    assert store.lease(ask.id).state == "awaiting_approval"  # nothing changed
    out = store.approve(ask.id, offer="h100", actor="user:root")
    assert out.offer == "h100" and out.approval["asked_offer"] == "h100x2"
    assert out.units == 1.0 and len(out.slots) == 1


def test_bad_durations_and_reasons_name_the_field(store):
    for duration in (-1, 0, 59, 367 * 86400, float("nan"), True):
        e = refused(store.allocate, "alice", "", "h100x2", reason="x", duration=duration)
        assert (e.code, e.field) == ("invalid_field", "duration"), duration
    e = refused(store.allocate, "admin", "", "big", reason="x" * 256)
    assert (e.code, e.field) == ("invalid_field", "reason")


def test_the_exception_ceiling_is_validated():
    with pytest.raises(ConfigError) as e:
        QuotaSpec.parse({"limit": 2, "exception": 2}, "quotas.default")
    assert e.value.field == "quotas.default.exception"
    with pytest.raises(ConfigError) as e:
        QuotaSpec.parse({"exception": 2}, "quotas.users.x")
    assert e.value.field == "quotas.users.x.exception"
    assert QuotaSpec.parse({"limit": 1, "exception": 3}).to_dict()["exception"] == 3.0


# -- the lapse of approved time --------------------------------------------------------


def test_approved_time_gives_a_notice_then_the_round_ends_the_lease_lapsed(store, clock):
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=2 * HOUR)
    granted = store.approve(ask.id, actor="user:root")
    lease = store.keepalive(granted.id)
    warn = 600.0  # the default policy's warn_before
    clock.advance(seconds=2 * HOUR - warn - 1)
    assert store.lapse_approvals() == (0, 0)
    clock.advance(seconds=1)  # warn_before ahead of the lapse
    assert store.lapse_approvals() == (1, 0)
    out = store.lease(lease.id)
    assert out.state == "reclaiming" and out.reclaim.kind == "exception"
    assert out.reclaim.deadline == granted.lapses
    assert store.lapse_approvals() == (0, 0)  # noticed once
    e = refused(store.keepalive, lease.id, actor="user:alice")
    assert e.code == "not_extendable" and "approved exception" in e.message
    assert quiet_round(store, clock, lease).kind == "noticed"  # busy or not
    clock.advance(seconds=warn)
    d = quiet_round(store, clock, lease)
    assert d.kind == "act" and d.release_reason == "lapsed"
    done = store.reclaim_outcome(lease.id, HOLDER, "done", saved=["a.ipynb"])
    assert done.state == "released" and done.release_reason == "lapsed"


def test_a_lapse_carried_out_by_the_service_itself_is_lapsed(store, clock):
    """No reclaimer running: the service enforces the overdue exception notice, and the lease
    is released ``lapsed`` as the reclaimer would have (not ``admin``)."""
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=HOUR)
    lease = store.keepalive(store.approve(ask.id).id)
    clock.advance(seconds=HOUR - 600)
    assert store.lapse_approvals() == (1, 0)
    clock.advance(seconds=600 + 121)  # the deadline, then the enforcement bound
    [claimed] = store.enforce_notices(120, actor="service:gpupool")
    assert (claimed.lease, claimed.kind) == (lease.id, "exception")
    done = store.notice_enforced(lease.id, True, actor="service:gpupool")
    assert done.state == "released" and done.release_reason == "lapsed"
    items, _ = store.events(lease=lease.id, kind="reclaim-acting")
    assert items[-1].data["release_reason"] == "lapsed"


def test_an_approved_exception_is_never_borrowed(store, clock):
    """Beyond its owner's guarantee, yet not borrowed: granted so, and still so after another
    lease of the owner ends and the flags are derived again."""
    first = store.allocate("alice", "", "h100")  # alice: guarantee 1, limit 1, exception 2
    assert first.borrowed is False
    ask = store.allocate("alice", "x", "h100", reason="deadline", duration=HOUR)
    assert ask.state == "awaiting_approval"
    granted = store.approve(ask.id)
    assert granted.state == "granted" and granted.borrowed is False
    store.release(first.id)  # a release derives the owner's flags again
    assert store.lease(granted.id).borrowed is False
    store.put_quota("users", "alice", {"guarantee": 0, "limit": 1, "exception": 2})
    assert store.lease(granted.id).borrowed is False  # so does a quota change


def test_a_notice_always_comes_first_even_when_housekeeping_was_late(store, clock):
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=HOUR)
    lease = store.keepalive(store.approve(ask.id).id)
    clock.advance(seconds=2 * HOUR)  # the service was down past the lapse
    assert store.lapse_approvals() == (1, 0)
    deadline = store.lease(lease.id).reclaim.deadline
    assert deadline == clock() + timedelta(seconds=600)


def test_an_approved_request_still_queued_when_its_time_ends_lapses(store, clock):
    held = [store.allocate(u, "", "h100") for u in ("bob", "dan", "eve", "fay")]
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=HOUR)
    assert store.approve(ask.id).state == "queued"
    clock.advance(seconds=HOUR + 1)
    assert store.lapse_approvals() == (0, 1)
    out = store.lease(ask.id)
    assert out.state == "released" and out.release_reason == "lapsed"
    assert all(store.lease(h.id).state == "granted" for h in held)


def test_a_restarted_pool_keeps_a_queued_exception_to_the_ceiling(store, db_url, clock):
    held = [store.allocate(u, "", "h100") for u in ("bob", "dan", "eve")]
    ask = store.allocate("alice", "", "h100x2", reason="deadline", duration=HOUR)
    assert store.approve(ask.id).state == "queued"
    again = make_store(db_url, clock, POOL)  # a new process: the allocator from the rows
    again.release(held[0].id)
    assert again.lease(ask.id).state == "granted"


def test_time_awaiting_approval_is_not_a_queue_wait(store, clock):
    """Capacity planning's waits are waits for hardware: an approved request waited in the
    queue from its approval, and one denied while awaiting never queued at all."""
    start = clock()
    waited = store.allocate("admin", "", "big", reason="training")
    denied = store.allocate("dana", "", "big", reason="a hunch")
    clock.advance(hours=2)  # two hours with nobody deciding
    store.deny(denied.id, "ask for one GPU")
    assert store.approve(waited.id, actor="user:root").state == "granted"
    clock.advance(hours=1)
    store.release(waited.id)
    (day,) = [d for d in store.capacity(start, clock()) if d.offer == "big"]
    assert day.requests == 1  # the denied one is not demand for capacity
    assert (day.waits.p50_min, day.waits.p95_min) == (0.0, 0.0)  # granted on approval
    assert day.held_unit_hours == pytest.approx(4.0)


def test_reconcile_withdraws_requests_of_deleted_servers_and_keeps_stopped_ones(store):
    """A server deleted while its request waited for approval never reports a stop (it was
    not running): the reconcile withdraws the request of a server the hub no longer has. A
    request for a server that is merely stopped (not running: every awaiting one) stays."""
    deleted = store.allocate("admin", "paper", "big", reason="the paper deadline")
    stopped = store.allocate("dana", "", "big", reason="a second paper")
    held = store.allocate("dana", "other", "h100")
    assert store.reconcile({("dana", "other")}, deleted=[("admin", "paper")]) == 1
    assert store.lease(deleted.id).state == "released"
    assert store.lease(deleted.id).release_reason == "withdrawn"
    assert store.lease(stopped.id).state == "awaiting_approval"
    assert store.lease(held.id).state == "granted"
    assert store.reconcile({("dana", "other")}) == 0  # nothing deleted: awaiting ones stay
    assert store.lease(stopped.id).state == "awaiting_approval"
    assert events(store, deleted.id) == ["approval-requested", "released"]

"""Idle-GPU reclamation in the store, on SQLite and PostgreSQL: notices, "keep my GPU" and its
limit, cancellation when the lease works again, the claimed action and the keepalive race, the
release reason whoever releases, outcomes (a shrink's target withdrawn on failure), a restart
mid-grace, the leader lock, the admin's policy override, stale data, and the user's history.

Time is the store's clock (``StoreClock``); each round covers the minute before it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.errors import ConfigError
from jupyterhub_gpupool.pool.reclaim import GpuSample, KernelView, PresenceView
from jupyterhub_gpupool.service.serialize.leases import watched_lease_json
from jupyterhub_gpupool.service.utilization import MinuteStats
from jupyterhub_gpupool.store import Store, StoreError
from jupyterhub_gpupool.store.read.leases import LeaseView, ReclaimView
from jupyterhub_gpupool.store.read.reclaim import LeaderView, PastReclaimView, ReclaimMinute
from jupyterhub_gpupool.store.read.users import UserNoticeView
from jupyterhub_gpupool.store.rows import epoch
from tests.fakes import STORE_POOL, StoreClock, make_instances, make_store
from tests.fakes import lease_events as events

#: Short timeouts: an idle lease gets notice after 8 minutes, is reclaimed after 10.
POLICY = {
    "default": {
        "idle_timeout": "10m",
        "pressure_idle_timeout": "5m",
        "cpu_busy_timeout": "30m",
        "warn_before": "2m",
        "max_extensions": 1,
        "extension": "10m",
        "busy_grace": 0,
        "min_runtime": 0,
    },
    "offers": {"a100-3g": {"action": "shrink:a100-1g"}},
}
POOL = {**STORE_POOL, "reclaim": POLICY}
HOLDER = "reclaimer-1"


@pytest.fixture
def url(db_url: str) -> str:
    upgrade(db_url)
    return db_url


@pytest.fixture
def store(url: str, clock: StoreClock) -> Store:
    store = make_store(url, clock, pool=POOL)
    store.take_leader(HOLDER, 600)
    return store


def bound(store: Store, offer: str = "h100", user: str = "alice", server: str = "") -> LeaseView:
    """A lease bound by its server (``active``)."""
    lease = store.allocate(user, server, offer)
    if offer.startswith("a100"):
        make_instances(store)
    return store.keepalive(lease.id)


def devices(lease: LeaseView) -> list[tuple[str, int | None]]:
    return [(s.gpu, s.start if s.kind == "mig" else None) for s in lease.slots]


def step(
    store: Store,
    clock: StoreClock,
    *leases: LeaseView,
    util: float = 0.0,
    kernel: str = "idle",
    typing: bool = False,
    seen: bool = True,
    samples: bool = True,
    minutes: float = 1,
    holder: str = HOLDER,
    renew: bool = True,
    during: Any = None,
) -> dict[str, dict[str, Any]]:
    """Move on ``minutes`` and run a round over them: every lease's GPU at ``util`` (MIG: no
    utilization, little memory), its kernel ``kernel``, its user typing or away; ``seen``
    False: the reclaimer reached neither. Returns the decisions by lease."""
    clock.advance(minutes=minutes)
    if during is not None:  # what happens within the window, at its end
        during()
    if renew:  # as the reclaimer renews its lead before each round
        store.take_leader(holder, 600)
    now = epoch(clock())
    start = now - 60 * minutes
    observed, by_device = {}, {}
    for lease in leases:
        if seen:
            observed[lease.id] = (
                KernelView(now, kernel, None),
                PresenceView(now, now - 1 if typing else None, 1),
            )
        if samples:
            for gpu, mig in devices(lease):
                u = None if mig is not None else util
                by_device[(gpu, mig)] = [GpuSample(t, u, 10) for t in (start + 1, now)]
    answer = store.reclaim_round(holder, (start, now), observed, by_device)
    assert answer.now == now
    return {d.lease: d for d in answer.decisions}


def until(store: Store, clock: StoreClock, lease: LeaseView, kind: str, limit: int = 60, **kw: Any):
    """Rounds a minute apart until the lease's decision is ``kind``; returns it."""
    for _ in range(limit):
        d = step(store, clock, lease, **kw)[lease.id]
        if d.kind == kind:
            return d
    raise AssertionError(f"no {kind} within {limit} rounds (last: {d})")


def refused(call, *args: Any, **kw: Any) -> StoreError:
    with pytest.raises(StoreError) as e:
        call(*args, **kw)
    return e.value


# -- notice, keep my GPU, cancel -------------------------------------------------------------


def test_notice_then_keepalive_extends_then_the_limit_refuses(store, clock):
    lease = bound(store)
    notice = until(store, clock, lease, "notice")
    assert notice.action == "stop" and notice.evidence["verdict"] == "idle"
    assert clock() == clock().replace(hour=9, minute=8)  # 10 min idle, 2 min notice ahead
    shown = store.lease(lease.id)
    assert shown.state == "reclaiming"
    assert shown.reclaim == ReclaimView(
        heading="Idle GPU: it will be reclaimed",
        keep=True,
        why_not_kept=None,
        kind="idle",
        deadline=datetime(2026, 3, 2, 9, 10),
        reason=notice.reason,
        action="stop",
        issued=datetime(2026, 3, 2, 9, 8),
        pressure=False,
        extensions=0,
        max_extensions=1,
        extendable=True,
        acting=False,
    )
    me = store.user("alice")
    assert me.notices == (UserNoticeView(lease.id, notice.reason, "stop", notice.deadline),)

    kept = store.keepalive(lease.id, actor="user:alice")
    assert kept.state == "active" and kept.reclaim is None
    assert events(store, lease.id)[-2:] == ["reclaim-notice", "reclaim-extended"]
    # the extension holds the next notice back for 10 minutes (and the counts start again)
    again = until(store, clock, lease, "notice")
    assert clock() >= clock().replace(hour=9, minute=16)
    assert store.lease(lease.id).reclaim.extendable is False
    e = refused(store.keepalive, lease.id)
    assert (e.code, e.allowed) == ("extension_limit", [1]) and "1 extensions" in e.message
    assert store.lease(lease.id).state == "reclaiming"
    assert again.kind == "notice"


def test_a_notice_is_cancelled_when_the_gpu_works_again(store, clock):
    lease = bound(store)
    until(store, clock, lease, "notice")
    d = step(store, clock, lease, util=80.0)[lease.id]
    assert d.kind == "cancel" and d.reason == "the GPU got busy again"
    assert d.evidence["gpu"] == "busy"
    assert store.lease(lease.id).state == "active"
    assert store.lease(lease.id).reclaim is None
    kinds = events(store, lease.id)
    assert kinds[-2:] == ["reclaim-notice", "reclaim-cancelled"]
    data = store.events(lease=lease.id)[0][-1].data
    assert data["evidence"]["gpu"] == "busy" and data["reason"] == "the GPU got busy again"


def test_a_busy_kernel_on_a_busy_gpu_is_never_reclaimed(store, clock):
    lease = bound(store)
    for _ in range(40):
        d = step(store, clock, lease, util=90.0, kernel="busy")[lease.id]
        assert d.kind == "none", d
    assert store.lease(lease.id).state == "active"


# -- the action and the race with keepalive --------------------------------------------------


def test_act_claims_the_lease_and_keepalive_then_loses(store, clock):
    lease = bound(store)
    until(store, clock, lease, "notice")
    act = until(store, clock, lease, "act")
    assert act.action == "stop" and act.release_reason == "reclaimed-idle"
    assert act.deadline == datetime(2026, 3, 2, 9, 10) and act.evidence["verdict"] == "idle"
    assert store.lease(lease.id).reclaim.acting is True
    e = refused(store.keepalive, lease.id)
    assert e.code == "reclaim_in_progress"
    assert events(store, lease.id)[-1] == "reclaim-acting"  # the act won, and says so
    # a claimed lease is not decided again while its outcome is awaited
    d = step(store, clock, lease)[lease.id]
    assert d.kind == "none" and "being reclaimed" in d.reason


def test_keepalive_first_and_the_round_does_not_act(store, clock):
    lease = bound(store)
    until(store, clock, lease, "notice")
    clock.advance(minutes=2)  # at the deadline the user presses "keep my GPU" first
    store.keepalive(lease.id, actor="user:alice")
    d = step(store, clock, lease, minutes=0.5)[lease.id]
    assert d.kind == "none"
    assert store.lease(lease.id).state == "active"
    assert "reclaim-acting" not in events(store, lease.id)
    assert events(store, lease.id)[-1] == "reclaim-extended"


def test_a_claim_without_outcome_is_handed_out_again(store, clock):
    lease = bound(store)
    first = until(store, clock, lease, "act")
    for _ in range(14):  # the reclaimer that claimed it died; nothing for 15 minutes
        assert step(store, clock, lease)[lease.id].kind == "none"
    again = step(store, clock, lease)[lease.id]
    assert again.kind == "act" and again.action == first.action
    assert events(store, lease.id)[-2:] == ["reclaim-acting", "reclaim-acting"]


def test_release_of_a_claimed_lease_records_the_claimed_reason(store, clock):
    lease = bound(store)
    until(store, clock, lease, "act")
    # the spawner's stop during the action releases it as "stopped"
    done = store.release(lease.id, reason="stopped", actor="service:spawner")
    assert done.release_reason == "reclaimed-idle"
    # the reclaimer's outcome comes after: the lease stays released as it was
    after = store.reclaim_outcome(lease.id, HOLDER, "done", ["work.ipynb"], "saved 1 file")
    assert after.release_reason == "reclaimed-idle" and after.state == "released"
    assert events(store, lease.id)[-2:] == ["released", "reclaimed"]


def test_outcome_done_releases_and_the_user_sees_it(store, clock):
    lease = bound(store)
    gpu = lease.slots[0].gpu
    until(store, clock, lease, "act")
    minute = clock().replace(minute=5, second=0)
    stats = MinuteStats(1, 1, 40.0, 40.0, 2048)
    store.write_minutes({(gpu, -1, minute): stats})
    done = store.reclaim_outcome(lease.id, HOLDER, "done", ["a.ipynb", "b.py"], "saved 2")
    assert done.state == "released" and done.release_reason == "reclaimed-idle"
    e = refused(store.reclaim_outcome, lease.id, HOLDER, "done")
    assert e.code == "not_acting"
    (past,) = store.user("alice").reclaims
    assert past == PastReclaimView(
        lease=lease.id,
        offer="h100",
        server="",
        at=datetime(2026, 3, 2, 9, 10),
        kind="idle",
        action="stop",
        reason=past.reason,
        release_reason="reclaimed-idle",
        saved=("a.ipynb", "b.py"),
        outcome="done",
        detail="saved 2",
        utilization=(ReclaimMinute(datetime(2026, 3, 2, 9, 5), 40.0, 2048),),
    )
    assert "idle" in past.reason


def test_outcome_failed_keeps_the_lease_and_withdraws_the_shrink_target(store, clock):
    lease = bound(store, "a100-3g")
    until(store, clock, lease, "notice")
    act = until(store, clock, lease, "act")
    assert act.action == "shrink:a100-1g" and act.target_offer == "a100-1g"
    target = store.lease(act.target_lease)
    assert target.state == "granted" and target.resize_of == lease.id
    failed = store.reclaim_outcome(lease.id, HOLDER, "failed", [], "the restart timed out")
    assert failed.state == "active" and failed.reclaim is None
    assert store.lease(target.id).release_reason == "cancelled"
    assert events(store, lease.id)[-1] == "reclaim-failed"
    # the counts start again: no new notice before another 8 idle minutes
    for _ in range(7):
        assert step(store, clock, lease)[lease.id].kind == "none"
    (past,) = store.user("alice").reclaims
    assert past.outcome == "failed" and past.detail == "the restart timed out"


def test_shrink_done_binds_the_target_and_releases_the_old_lease_as_reclaimed(store, clock):
    lease = bound(store, "a100-3g")
    act = until(store, clock, lease, "act")
    make_instances(store)
    # the spawner restarts the server on the reserved target: binding it ends the old one
    store.keepalive(act.target_lease)
    assert store.lease(lease.id).release_reason == "reclaimed-idle"
    store.reclaim_outcome(lease.id, HOLDER, "done", ["x.ipynb"])
    assert store.lease(act.target_lease).state == "active"


# -- faults: a restart, stale data, the leader -------------------------------------------------


def test_a_restart_mid_grace_keeps_the_deadline_and_acts_at_it(url, store, clock):
    lease = bound(store)
    until(store, clock, lease, "notice")
    deadline = store.lease(lease.id).reclaim.deadline
    again = make_store(url, clock, pool=POOL)  # a new service process on the same database
    assert again.lease(lease.id).reclaim.deadline == deadline
    assert step(again, clock, lease)[lease.id].kind == "noticed"
    act = step(again, clock, lease)[lease.id]
    assert deadline == datetime(2026, 3, 2, 9, 10)
    assert act.kind == "act" and act.deadline == datetime(2026, 3, 2, 9, 10)


def test_stale_data_never_acts(store, clock):
    lease = bound(store)
    until(store, clock, lease, "notice")
    # past the deadline, but the user's server was not reached: nothing happens
    for _ in range(5):
        d = step(store, clock, lease, seen=False)[lease.id]
        assert d.kind == "stale" and "not reached" in d.reason
    # no GPU samples in the window: nothing happens either
    d = step(store, clock, lease, samples=False)[lease.id]
    assert d.kind == "stale" and "telemetry" in d.reason
    # a window that ended long ago
    now = epoch(clock())
    answer = store.reclaim_round(HOLDER, (now - 900, now - 600), {}, {})
    assert answer.stale == 1
    assert store.lease(lease.id).reclaim.acting is False
    assert "reclaim-acting" not in events(store, lease.id)


def test_stale_counts_restart_so_fresh_data_must_show_idleness_again(store, clock):
    lease = bound(store)
    for _ in range(7):
        step(store, clock, lease)
    step(store, clock, lease, seen=False)
    for _ in range(7):
        assert step(store, clock, lease)[lease.id].kind == "none"


def test_leader_lock(url, store, clock):
    e = refused(store.take_leader, "reclaimer-2", 60)
    assert e.code == "not_leader" and HOLDER in e.message
    lease = bound(store)
    e = refused(step, store, clock, lease, holder="reclaimer-2", renew=False)
    assert e.code == "not_leader"
    assert store.take_leader(HOLDER, 60).leader is True  # renewing
    clock.advance(seconds=61)
    taken = store.take_leader("reclaimer-2", 30)
    assert taken == LeaderView("reclaimer-2", clock() + timedelta(seconds=30), True)
    e = refused(step, store, clock, lease, holder=HOLDER, renew=False)
    assert e.code == "not_leader"
    assert store.give_up_leader("reclaimer-2").holder is None
    assert store.take_leader(HOLDER, 60).holder == HOLDER
    e = refused(store.take_leader, HOLDER, 3)
    assert (e.code, e.field) == ("invalid_field", "ttl")


def test_two_replicas_racing_for_the_lead_get_one_leader(url, clock):
    stores = [make_store(url, clock, pool=POOL) for _ in range(2)]

    def take(i: int) -> str:
        try:
            return stores[i].take_leader(f"replica-{i}", 60).holder
        except StoreError as e:
            return e.code

    with ThreadPoolExecutor(2) as pool:
        got = sorted(pool.map(take, range(2)))
    assert got[0] == "not_leader" and got[1].startswith("replica-"), got


def test_outcome_needs_a_claim_and_the_lead(store, clock):
    lease = bound(store)
    e = refused(store.reclaim_outcome, lease.id, HOLDER, "done")
    assert e.code == "not_acting"
    e = refused(store.reclaim_outcome, lease.id, "someone-else", "done")
    assert e.code == "not_leader"
    e = refused(store.reclaim_outcome, lease.id, HOLDER, "maybe")
    assert (e.code, e.field) == ("invalid_field", "result")


# -- notices that cannot be kept -------------------------------------------------------------


def test_a_max_age_notice_cannot_be_kept(store, clock):
    store.put_reclaim_policy({"default": {**POLICY["default"], "max_age": "1h"}})
    lease = bound(store)
    for _ in range(60):
        d = step(store, clock, lease, util=80.0)[lease.id]
        if d.kind == "notice":
            break
    assert store.lease(lease.id).reclaim.kind == "max_age"
    e = refused(store.keepalive, lease.id)
    assert e.code == "not_extendable"
    assert store.lease(lease.id).reclaim.extendable is False


def test_an_approved_exception_is_not_taken_back_as_borrowed_capacity(store, clock):
    """The administrator's approval stands until it lapses: a waiter within guarantee does
    not get the exception's GPU through the borrowed rule (an idle one still goes by the
    idle rules, with notice)."""
    store.put_quota("users", "bob", {"guarantee": 0, "limit": 0.5, "exception": 1})
    ask = store.allocate("bob", "", "h100", reason="deadline", duration=86400)
    lease = store.keepalive(store.approve(ask.id, actor="user:admin").id)
    assert lease.borrowed is False and lease.exception is True  # never borrowed
    waiter = store.allocate("alice", "", "h100")
    assert waiter.state == "queued"
    d = step(store, clock, lease)[lease.id]  # idle: a borrowed lease would get notice now
    assert d.kind == "none", d
    for _ in range(3):
        step(store, clock, lease)
        rec = store.lease(lease.id).reclaim
        assert rec is None or rec.kind != "borrowed", rec


def test_borrowed_capacity_goes_to_a_waiter_within_guarantee(store, clock):
    store.put_quota("users", "bob", {"guarantee": 0, "limit": 4})
    lease = bound(store, user="bob")
    assert lease.borrowed is True
    step(store, clock, lease, util=80.0)  # working: a busy borrowed lease is not taken
    waiter = store.allocate("alice", "", "h100")
    assert waiter.state == "queued"
    d = step(store, clock, lease, util=80.0)[lease.id]
    assert d.kind == "none"
    d = step(store, clock, lease)[lease.id]  # idle now: notice for the waiter
    assert d.kind == "notice" and "alice" in d.reason
    rec = store.lease(lease.id).reclaim
    assert rec.kind == "borrowed" and rec.pressure is True and rec.extendable is False
    e = refused(store.keepalive, lease.id)
    assert e.code == "not_extendable"
    store.release(waiter.id)  # alice gives up: the notice goes
    d = step(store, clock, lease)[lease.id]
    assert d.kind == "cancel" and "withdrawn" in d.reason


#: The browser tests' policy: the pressure timeout ends with the first idle window (3 min, the
#: notice 2 min ahead) and a lease is never borrowed back before it ran 3 minutes.
SHORT = {**POLICY["default"], "pressure_idle_timeout": "3m", "min_runtime": "3m"}


def test_a_quota_change_makes_a_running_lease_borrowed_and_the_short_pressure_timeout_wins(
    store, clock
):
    """What a borrowed notice needs, and why none came while the GPU worked: a lease granted
    within guarantee is borrowed as soon as its owner's guarantee drops below it; a waiter
    within guarantee is in the round's queue; but a borrowed lease busy on the GPU is never
    taken back (``reclaim_busy_borrowed`` off, the default), and once it is idle the idle
    notice under pressure comes in the same round when the pressure timeout is that short."""
    store.put_reclaim_policy({"default": SHORT})
    lease = bound(store, user="bob")
    assert lease.borrowed is False  # within the default guarantee of 1
    store.put_quota("users", "bob", {"guarantee": 0, "limit": 4})
    assert store.lease(lease.id).borrowed is True  # re-derived by the quota change
    waiter = store.allocate("alice", "", "h100")
    assert waiter.state == "queued"
    for _ in range(6):  # well past min_runtime, the GPU at work: no notice of any kind
        d = step(store, clock, lease, util=80.0)[lease.id]
        assert d.kind == "none", d
    d = step(store, clock, lease)[lease.id]
    assert d.kind == "notice" and d.evidence["pressure"] is True, d
    assert store.lease(lease.id).reclaim.kind == "idle"


def test_an_admin_may_let_borrowed_reclaim_take_a_busy_gpu(store, clock):
    """With ``reclaim_busy_borrowed`` a borrowed lease busy on the GPU gets the borrowed notice
    once it ran ``min_runtime`` (never the idle one: it works), cannot be kept, and is taken at
    the deadline though it still works; the waiter within guarantee gets the GPU."""
    store.put_reclaim_policy({"default": {**SHORT, "reclaim_busy_borrowed": True}})
    store.put_quota("users", "bob", {"guarantee": 0, "limit": 4})
    lease = bound(store, user="bob")
    assert lease.borrowed is True
    waiter = store.allocate("alice", "", "h100")
    kinds = [step(store, clock, lease, util=80.0)[lease.id].kind for _ in range(3)]
    assert kinds == ["none", "none", "notice"], kinds  # min_runtime: 3 minutes
    rec = store.lease(lease.id).reclaim
    assert rec.kind == "borrowed" and rec.extendable is False
    assert "alice (within guarantee) waits for" in rec.reason
    assert refused(store.keepalive, lease.id).code == "not_extendable"
    act = until(store, clock, lease, "act", util=80.0)
    assert act.release_reason == "reclaimed-borrowed"
    store.reclaim_outcome(lease.id, HOLDER, "done")
    assert store.lease(lease.id).state == "released"
    assert store.lease(waiter.id).state == "granted"


def test_someone_waiting_shortens_the_idle_timeout(store, clock):
    lease = bound(store)
    store.allocate("bob", "", "h100")  # waits for what alice's idle lease holds
    notice = until(store, clock, lease, "notice")
    assert clock() == clock().replace(hour=9, minute=3)  # 5 min pressure timeout, 2 ahead
    assert notice.evidence["pressure"] is True
    assert store.lease(lease.id).reclaim.pressure is True


# -- policies --------------------------------------------------------------------------------


def test_policy_override_is_validated_persisted_and_reset(url, store, clock):
    got = store.reclaim_policy()
    assert got.source == "file" and got.section == POLICY
    assert got.offers["a100-3g"].action == "shrink:a100-1g"
    e = refused(store.put_reclaim_policy, {"offers": {"h100": {"idle_timeout": -5}}})
    assert (e.code, e.field) == ("invalid_field", "reclaim.offers.h100.idle_timeout")
    e = refused(store.put_reclaim_policy, {"offers": {"nope": {}}})
    assert (e.code, e.field) == ("invalid_field", "reclaim.offers") and "nope" in e.message
    e = refused(store.put_reclaim_policy, {"offers": {"a100-1g": {"action": "shrink:h100"}}})
    assert e.field == "reclaim.offers.a100-1g.action"
    assert store.reclaim_policy().source == "file"

    put = store.put_reclaim_policy({"default": {"idle_timeout": "2h"}}, actor="user:admin")
    assert put.source == "api" and put.default.idle_timeout == 7200.0
    restarted = make_store(url, clock, pool=POOL)
    assert restarted.reclaim_policy().source == "api"  # in the database: survives restarts
    lease = bound(restarted)
    for _ in range(30):  # 2 h idle timeout now: no notice within 30 minutes
        assert step(restarted, clock, lease)[lease.id].kind == "none"
    assert restarted.reset_reclaim_policy().source == "file"


def test_pool_config_reclaim_errors_name_the_field(url, clock):
    bad = {**STORE_POOL, "reclaim": {"default": {"warn_before": "soon"}}}
    with pytest.raises(ConfigError) as e:
        make_store(url, clock, pool=bad)
    assert e.value.field == "reclaim.default.warn_before"
    plain = make_store(url, clock)  # no reclaim section: the defaults, reclaim on
    assert plain.reclaim_policy().source == "default"
    assert plain.reclaim_policy().default.enabled is True


# -- the reclaimer's view ----------------------------------------------------------------------


def test_watched_leases_and_devices(store, clock):
    lease = bound(store)
    granted = store.allocate("bob", "", "a100-1g")  # not bound yet: not watched
    items, total = store.reclaim_leases()
    assert total == 1 and items[0].id == lease.id and items[0].reclaim is None
    assert set(watched_lease_json(items[0])) == {
        "id", "user", "server", "offer", "state", "node", "granted_at", "server_url", "reclaim"
    }  # fmt: skip
    assert store.reclaim_devices() == {lease.id: devices(lease)}
    until(store, clock, lease, "notice")
    assert store.reclaim_leases()[0][0].reclaim.kind == "idle"
    assert store.reclaiming_count() == 1
    assert granted.id not in store.reclaim_devices()


# -- presence from the lab -------------------------------------------------------------------


def test_where_the_lab_reports_only_its_input_is_presence(store, clock):
    """Once the server's lab announced itself, what the reclaimer saw as input no longer
    counts (an open tab's polling, the hub's stamps): only the lab's reports do."""
    quiet, typing = bound(store), bound(store, "a100-3g", user="bob")
    assert store.report_presence(quiet.id, None).source == "lab"
    assert store.report_presence(typing.id, None).last_input is None
    # the reclaimer "sees" fresh input for both (as the hub's last_activity would say)
    for minute in range(40):
        # the lab: input 5 s ago, reported once in each minute's window
        report = lambda: store.report_presence(typing.id, 5.0)  # noqa: E731
        decisions = step(store, clock, quiet, typing, typing=True, during=report)
        assert decisions[typing.id].kind != "notice", (minute, decisions)
        if decisions[quiet.id].kind == "notice":
            break
    else:
        raise AssertionError("the untouched lab's lease never got a notice")
    assert "idle" in decisions[quiet.id].reason


def test_a_lab_report_never_moves_input_back_and_is_checked(store, clock):
    lease = bound(store)
    now = epoch(clock())
    first = store.report_presence(lease.id, 0.0).last_input
    assert first is not None
    assert abs(epoch(first) - now) < 1
    assert store.report_presence(lease.id, 300.0).last_input == first  # an old input
    for bad in (-1.0, 601.0):
        assert refused(store.report_presence, lease.id, bad).field == "idle_for"
    store.release(lease.id)
    assert refused(store.report_presence, lease.id, 1.0).code == "not_live"
    assert refused(store.report_presence, "nope", 1.0).code == "not_found"


def test_a_training_job_is_never_idle_reclaimed(store, clock):
    """Its class has ``idle_reclaim: false``: the reclaimer does not watch its lease at all,
    while a server's idle lease beside it gets its notice."""
    job = store.submit_job("bob", "a100-1g", ["python", "train.py"])
    make_instances(store)
    store.job_status(job.id, "running")
    server = bound(store)
    job_lease = store.lease(job.lease_id)
    assert job_lease.state == "active"
    assert until(store, clock, server, "notice")
    for _ in range(20):
        decisions = step(store, clock, server, job_lease)
        assert job.lease_id not in decisions
    assert store.lease(job.lease_id).state == "active"
    assert store.job(job.id).state == "running"


def test_the_reclaimer_is_not_given_job_leases_it_may_not_reclaim(store):
    job = store.submit_job("bob", "h100", ["python", "serve.py"], "inference")
    store.job_status(job.id, "running")
    server = bound(store, "a100-1g")
    leases, total = store.reclaim_leases()
    assert [le.id for le in leases] == [server.id] and total == 1
    assert job.lease_id not in store.reclaim_devices()

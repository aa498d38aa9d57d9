"""Budgets that hold (issue 32): warnings at 80 % and 100 % once per period; with
``budget_action: stop`` the running leases get a budget notice and are stopped through the
reclaim notice path (saving first) — released ``budget`` whoever carries it out; ``refuse``
and ``notify`` leave running leases alone, and ``notify`` refuses nothing."""

from __future__ import annotations

import asyncio
from datetime import datetime

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import USE
from jupyterhub_gpupool.store import StoreError
from tests.fakes import STORE_POOL, InProcessService, StoreClock, make_store, request

T0 = datetime(2026, 11, 2, 9, 0)
SERVICE = "service:gpupool"


def pool_with(action: str) -> dict:
    users = {"alice": {"guarantee": 1, "limit": 4, "budget": 10, "budget_action": action,
                       "budget_minimum": 0.5}}  # fmt: skip
    return {**STORE_POOL, "quotas": {"default": {"guarantee": 1, "limit": 4}, "users": users}}


@pytest.fixture
def clock():
    return StoreClock(T0)


def started(db_url, clock, action):
    upgrade(db_url)
    store = make_store(db_url, clock, pool_with(action))
    store.budget_refresh = 0  # recount the used hours at every write (the tests move the clock)
    lease = store.allocate("alice", "a", "h100")
    store.keepalive(lease.id)
    return store, lease


def test_warnings_at_80_and_100_percent_once_each(db_url, clock):
    store, lease = started(db_url, clock, "refuse")
    clock.advance(hours=7)
    assert store.budget_round() == []  # 7 of 10: nothing yet
    clock.advance(hours=1)
    [w80] = store.budget_round()
    assert (w80.subject, w80.name, w80.level, w80.action) == ("user", "alice", 80, "refuse")
    assert w80.used_unit_hours == 8.0 and w80.budget == 10.0
    assert (w80.period, w80.period_start) == ("month", datetime(2026, 11, 1))
    assert store.budget_round() == []  # said once
    clock.advance(hours=2)
    [w100] = store.budget_round()
    assert w100.level == 100
    # refuse: no new grant, but the running lease goes on
    assert store.lease(lease.id).state == "active"
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "b", "a100-1g")
    assert e.value.code == "budget_exhausted"


def test_a_grant_never_starts_with_less_than_the_minimum_left(db_url, clock):
    store, lease = started(db_url, clock, "refuse")
    clock.advance(hours=9, minutes=40)  # 9.67 of 10 used: 0.33 left, under the 0.5 minimum
    store.release(lease.id)
    with pytest.raises(StoreError) as e:
        store.allocate("alice", "b", "a100-1g")
    assert e.value.code == "budget_exhausted"


def test_notify_warns_and_refuses_nothing(db_url, clock):
    store, lease = started(db_url, clock, "notify")
    clock.advance(hours=11)
    assert [w.level for w in store.budget_round()] == [100]
    assert store.allocate("alice", "b", "a100-1g").state == "granted"
    assert store.lease(lease.id).reclaim is None


def test_stop_gives_a_budget_notice_and_the_lease_ends_budget(db_url, clock):
    store, lease = started(db_url, clock, "stop")
    clock.advance(hours=10)
    assert [w.level for w in store.budget_round(600)] == [100]
    out = store.lease(lease.id)
    assert out.state == "reclaiming"
    assert (out.reclaim.kind, out.reclaim.action) == ("budget", "stop")
    assert "budget" in out.reclaim.reason and "saved" in out.reclaim.reason
    assert store.user("alice").notices[0].lease == lease.id  # the user page, the lab
    store.budget_round(600)  # once: the deadline stays
    assert store.lease(lease.id).reclaim.deadline == out.reclaim.deadline
    # no reclaimer running: the service carries the notice out past its deadline
    clock.advance(seconds=600 + 121)
    [claimed] = store.enforce_notices(120, actor=SERVICE)
    assert claimed.kind == "budget"
    done = store.notice_enforced(lease.id, True, actor=SERVICE)
    assert done.state == "released" and done.release_reason == "budget"


def test_the_user_page_warns_from_80_percent(db_url, clock):

    store, _lease = started(db_url, clock, "stop")
    who = {"alice": {"kind": "user", "name": "alice", "scopes": [f"{USE}!user=alice"],
                     "groups": []}}  # fmt: skip
    with InProcessService(store, who) as api:
        clock.advance(hours=7)
        page = request("GET", f"{api.url}/", "alice").body.decode()
        assert "gpupool-budget-warning" not in page
        clock.advance(hours=1)
        store.budget_round()  # a write: the used hours are recounted
        page = request("GET", f"{api.url}/", "alice").body.decode()
        assert "You have used 80 % of your GPU-hour budget" in page
        clock.advance(hours=2)
        store.budget_round()
        page = request("GET", f"{api.url}/", "alice").body.decode()
        assert "budget of this month is spent" in page and "saved first" in page


def test_the_services_housekeeping_tells_the_notify_hook(db_url, clock):
    """The leader's housekeeping step passes each new warning to the notify_hook (once)."""
    store, _ = started(db_url, clock, "stop")
    heard: list[tuple[str, dict, dict]] = []

    async def hook(event: str, lease: dict, details: dict) -> None:
        heard.append((event, lease, details))

    service = InProcessService(store, {})
    service.svc.notify_hook = hook
    with service:
        clock.advance(hours=10)

        def step() -> list:
            done = asyncio.run_coroutine_threadsafe(service.svc.budget_step(), service.loop)
            return done.result(timeout=60)

        assert [w.level for w in step()] == [100]
        assert step() == []  # once per level and period
        asyncio.run_coroutine_threadsafe(service.svc.notifier.drain(), service.loop).result(60)
    [(event, lease, details)] = heard
    assert (event, lease) == ("budget-warning", {"id": "", "user": "alice"})
    assert details["level"] == 100 and details["action"] == "stop" and details["for"] == "user"
    assert (details["period_start"], details["used_unit_hours"]) == ("2026-11-01T00:00:00Z", 10.0)

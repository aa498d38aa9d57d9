"""The admin panel's and the user page's reads from the store as typed views: the live leases
with their age, idle time and notice, a user's days, the quota table and the quota preview."""

from __future__ import annotations

from datetime import date, timedelta
from fractions import Fraction

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.store import Store
from jupyterhub_gpupool.store.read.panel import DayUseView, QuotaEffectView, QuotaUseView
from jupyterhub_gpupool.store.read.quotas import QuotaView
from tests.fakes import StoreClock, make_store
from tests.fakes.clocks import STORE_T0


@pytest.fixture
def store(db_url: str, clock: StoreClock) -> Store:
    upgrade(db_url)
    return make_store(db_url, clock)


def test_a_live_lease_shows_its_age_and_notice(store, clock):
    held = store.keepalive(store.allocate("alice", "", "h100").id)
    clock.advance(minutes=10)
    store.admin_reclaim(held.id, grace=300, actor="user:admin")
    (live,) = store.live_leases()
    assert (live.id, live.user, live.offer, live.state) == (held.id, "alice", "h100", "reclaiming")
    assert (live.units, live.borrowed, live.node) == (1.0, False, "h100")
    assert (live.workload, live.job, live.since) == ("interactive", None, STORE_T0)
    assert (live.age_s, live.idle_s) == (600.0, 0.0)
    assert live.notice is not None
    assert (live.notice.kind, live.notice.acting) == ("admin", False)
    assert live.notice.deadline == STORE_T0 + timedelta(minutes=15)


def test_the_quota_table_lists_groups_then_users_with_their_use(store):
    store.allocate("alice", "", "h100")
    store.put_quota("groups", "ml", {"guarantee": 2, "limit": 3}, actor="user:admin")
    assert store.quota_table() == [
        QuotaUseView(
            QuotaView("ml", "group", "api", QuotaSpec(Fraction(2), Fraction(3))), 0.0, 0.0
        ),
        QuotaUseView(
            QuotaView("alice", "user", "default", QuotaSpec(Fraction(1), Fraction(4))), 1.0, 0.0
        ),
    ]


def test_the_quota_preview_says_which_leases_would_be_borrowed(store):
    held = store.allocate("alice", "", "h100")
    effect = store.quota_effect("users", "alice", {"guarantee": 0, "limit": 0.5})
    assert effect == QuotaEffectView(
        kind="user",
        name="alice",
        quota=QuotaSpec(Fraction(0), Fraction(1, 2)),
        held=1.0,
        become_borrowed=(held.id,),
        become_within=(),
        over_limit_by=0.5,
    )
    assert store.get_quota("users", "alice").source == "default"  # nothing changed


def test_a_users_days_count_the_hours_held(store, clock):
    held = store.allocate("alice", "", "h100")
    clock.advance(hours=2)
    store.release(held.id)
    assert store.user_history("alice", days=3) == (
        DayUseView(date(2026, 2, 28), 0.0, 0.0),
        DayUseView(date(2026, 3, 1), 0.0, 0.0),
        DayUseView(date(2026, 3, 2), 2.0, 0.0),
    )

"""The JSON of the admin panel's and the user page's read models (the live leases, the units
over time, a user's days, the quota table and the quota preview) against JSON written out by
hand; the builders of the live leases and of the units over time; and the views pickle."""

from __future__ import annotations

import pickle
from dataclasses import replace
from datetime import date, datetime
from fractions import Fraction
from types import SimpleNamespace

from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.service.serialize.panel import (
    day_uses_json,
    live_lease_json,
    quota_effect_json,
    quota_use_json,
    unit_series_json,
)
from jupyterhub_gpupool.store.read.panel import (
    DayUseView,
    LiveLeaseView,
    LiveNoticeView,
    QuotaEffectView,
    QuotaUseView,
    UnitSeriesView,
    live_lease_view,
    unit_series_view,
)
from jupyterhub_gpupool.store.read.poolmap import PreemptingView
from jupyterhub_gpupool.store.read.quotas import QuotaView

T0 = datetime(2026, 3, 2, 9, 15, 0)  # epoch 1772442900
T1 = datetime(2026, 3, 2, 9, 16, 30, 250000)

LIVE = LiveLeaseView(
    id="l1",
    user="alice",
    server="",
    offer="a100-1g",
    state="reclaiming",
    units=0.14,
    borrowed=True,
    node="gpu-1",
    workload="interactive",
    job=None,
    since=T0,
    age_s=600.0,
    idle_s=120.5,
    notice=LiveNoticeView("admin", T1, "maintenance", True),
)
SPEC = QuotaSpec(
    guarantee=Fraction(1, 2),
    limit=Fraction(2),
    budget=None,
    period="week",
    exception=Fraction(3),
    budget_action="notify",
    budget_minimum=Fraction(1, 4),
)
QUOTA_FIELDS = {
    "guarantee": 0.5,
    "limit": 2.0,
    "budget": None,
    "period": "week",
    "exception": 3.0,
    "budget_action": "notify",
    "budget_minimum": 0.25,
}


def test_a_live_lease_of_the_lease_table_with_its_notice():
    assert live_lease_json(LIVE) == {
        "id": "l1",
        "user": "alice",
        "server": "",
        "offer": "a100-1g",
        "state": "reclaiming",
        "units": 0.14,
        "borrowed": True,
        "node": "gpu-1",
        "class": "interactive",
        "job": None,
        "since": "2026-03-02T09:15:00Z",
        "age_s": 600.0,
        "idle_s": 120.5,
        "notice": {
            "kind": "admin",
            "deadline": "2026-03-02T09:16:30.250000Z",
            "reason": "maintenance",
            "acting": True,
        },
        "preempting": None,
    }


def test_a_live_lease_whose_job_is_preempting_carries_the_jobs_notice_not_a_lease_notice():
    reason = "preempted: the pool keeps 2 H100-80GB GPUs free for notebooks and services"
    lease = replace(LIVE, state="active", notice=None, preempting=PreemptingView(T1, reason))
    got = live_lease_json(lease)
    assert (got["state"], got["notice"]) == ("active", None)
    assert got["preempting"] == {"deadline": "2026-03-02T09:16:30.250000Z", "reason": reason}


def row(**more: object) -> SimpleNamespace:
    """A live lease's columns as ``PanelViews.live_leases`` reads them."""
    cols = {
        "id": "l2",
        "user": "bob",
        "server": "job:3",
        "offer": "h100",
        "state": "active",
        "units_f": 1.0,
        "borrowed": False,
        "node": "h-1",
        "granted": T0,
        "activated": None,
        "reclaim_state": None,
        "reclaim_kind": None,
        "reclaim_deadline": None,
        "reclaim_reason": None,
        "reclaim_acting": None,
        "workload": "training",
        "job": "resnet",
    }
    return SimpleNamespace(**{**cols, **more})


def test_a_live_leases_age_and_idle_time_are_seconds_to_now():
    now = 1772442900.0 + 90.04  # T0 + 90 s
    held = live_lease_view(row(reclaim_state={"gpu_idle_since": now - 30.0}), now)
    assert (held.since, held.age_s, held.idle_s) == (T0, 90.0, 30.0)
    assert (held.workload, held.job, held.notice) == ("training", "resnet", None)
    quiet = live_lease_view(row(activated=T1, workload=None, job=None), now)
    assert (quiet.since, quiet.idle_s, quiet.workload) == (T1, 0.0, "interactive")
    noticed = live_lease_view(
        row(reclaim_kind="idle", reclaim_deadline=T1, reclaim_acting="round-1"), now
    )
    assert noticed.notice == LiveNoticeView("idle", T1, None, True)


def test_units_held_and_queued_are_sampled_at_each_step():
    start = T0
    end = datetime(2026, 3, 2, 10, 15, 0)  # four 15-minute steps: five samples
    rows = [
        # held from the start, released at 9:45
        (1.0, T0, None, T0, datetime(2026, 3, 2, 9, 45)),
        # queued at 9:20, granted at 9:50, held on
        (0.5, datetime(2026, 3, 2, 9, 20), None, datetime(2026, 3, 2, 9, 50), None),
    ]
    series = unit_series_view(rows, start, end, 900)
    assert series == UnitSeriesView((1.0, 1.0, 0.0, 0.5, 0.5), (0.0, 0.5, 0.5, 0.0, 0.0))
    assert unit_series_json(series) == {
        "used": [1.0, 1.0, 0.0, 0.5, 0.5],
        "queued": [0.0, 0.5, 0.5, 0.0, 0.0],
    }


def test_a_users_days_are_dates_with_held_and_busy_hours():
    days = (DayUseView(date(2026, 3, 1), 0.0, 0.0), DayUseView(date(2026, 3, 2), 2.5, 1.25))
    assert day_uses_json(days) == [
        {"day": "2026-03-01", "held": 0.0, "busy": 0.0},
        {"day": "2026-03-02", "held": 2.5, "busy": 1.25},
    ]


def test_a_quota_table_row_is_the_quota_with_its_use_now():
    use = QuotaUseView(QuotaView("ml", "group", "api", SPEC), 1.5, 0.0)
    assert quota_use_json(use) == {
        "name": "ml",
        "kind": "group",
        "source": "api",
        **QUOTA_FIELDS,
        "held": 1.5,
        "borrowed_units": 0.0,
    }
    assert list(quota_use_json(use)) == [
        "name",
        "kind",
        "source",
        "guarantee",
        "limit",
        "budget",
        "period",
        "exception",
        "budget_action",
        "budget_minimum",
        "held",
        "borrowed_units",
    ]


def test_the_quota_previews_answer():
    effect = QuotaEffectView(
        kind="user",
        name="alice",
        quota=SPEC,
        held=2.5,
        become_borrowed=("l1", "l2"),
        become_within=(),
        over_limit_by=0.5,
    )
    assert quota_effect_json(effect) == {
        "kind": "user",
        "name": "alice",
        "quota": QUOTA_FIELDS,
        "held": 2.5,
        "become_borrowed": ["l1", "l2"],
        "become_within": [],
        "over_limit_by": 0.5,
    }


def test_the_panel_views_pickle():
    views = (
        LIVE,
        UnitSeriesView((1.0,), (0.0,)),
        DayUseView(date(2026, 3, 2), 1.0, 0.5),
        QuotaUseView(QuotaView("alice", "user", "default", SPEC), 1.0, 0.5),
        QuotaEffectView("group", "ml", SPEC, 0.0, (), ("l3",), 0.0),
    )
    for view in views:
        assert pickle.loads(pickle.dumps(view)) == view

"""The API's JSON of the command answers and reads that became read models (issue 34): the
reclaimer's leader lock and rounds, a job's log, a server's address, a re-partition's preview,
a node's MIG plan and a user's page, against JSON written out by hand (key order included:
the API's bytes stay the same). The builders turn the pool's answers into views; the views
cross the writer's process pipe, so they pickle."""

from __future__ import annotations

import json
import pickle
from datetime import datetime, timedelta, timezone
from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.pool.repartition import Held, Plan
from jupyterhub_gpupool.pool.rules.reclaim import Said
from jupyterhub_gpupool.service.serialize.jobs import job_log_appended_json, job_log_json
from jupyterhub_gpupool.service.serialize.mig import mig_plan_json
from jupyterhub_gpupool.service.serialize.presence import server_url_json
from jupyterhub_gpupool.service.serialize.reclaim import (
    decision_json,
    leader_json,
    past_reclaim_json,
    round_json,
)
from jupyterhub_gpupool.service.serialize.repartitions import repartition_plan_json
from jupyterhub_gpupool.service.serialize.users import user_json
from jupyterhub_gpupool.store.read.jobs import JobLogAppended, JobLogView
from jupyterhub_gpupool.store.read.mig import MigAction, mig_actions
from jupyterhub_gpupool.store.read.presence import ServerUrlView
from jupyterhub_gpupool.store.read.reclaim import (
    EnforcedNoticeView,
    LeaderView,
    PastReclaimView,
    ReclaimDecisionView,
    ReclaimMinute,
    ReclaimRoundView,
    WithdrawnNoticeView,
    decision_view,
    enforced_notice_view,
    round_view,
)
from jupyterhub_gpupool.store.read.repartitions import RepartitionPlanView
from jupyterhub_gpupool.store.read.users import UserNoticeView, UserView

T0 = datetime(2026, 3, 2, 9, 15, 0)
T1 = datetime(2026, 3, 2, 9, 16, 30, 250000)


class Row:
    """What a decision's builder reads of a lease's row."""

    id, user, server, offer = "l1", "alice", "gpu", "a100-3g"


NOTICE = ReclaimDecisionView(
    lease="l1",
    user="alice",
    server="gpu",
    offer="a100-3g",
    offer_name="A100 (3 slices)",
    kind="notice",
    reason="idle for 30 minutes",
    action="stop",
    deadline=T1,
    evidence={"gpu": "idle", "verdict": "idle"},
    notice_kind="idle",
    heading="Idle GPU: it will be reclaimed",
    keep=True,
)
ACT = ReclaimDecisionView(
    lease="l2",
    user="bob",
    server="",
    offer="a100-3g",
    offer_name="a100-3g",
    kind="act",
    reason="idle past the deadline",
    action="shrink:a100-1g",
    deadline=T0,
    release_reason="reclaimed-idle",
    target_offer="a100-1g",
    target_lease="l3",
    evidence={"verdict": "idle"},
)
STALE = ReclaimDecisionView("l4", "carol", "", "h100", "h100", "stale", "not reached")


def test_the_leader_locks_json():
    assert leader_json(LeaderView("reclaimer-1", T1, True)) == {
        "holder": "reclaimer-1",
        "expires": "2026-03-02T09:16:30.250000Z",
        "leader": True,
    }
    assert leader_json(LeaderView(None, None, False)) == {
        "holder": None,
        "expires": None,
        "leader": False,
    }


def test_a_rounds_json_writes_each_decision_with_only_what_it_says_in_the_reclaimers_order():
    out = round_json(ReclaimRoundView(1772443000.5, (NOTICE, ACT, STALE), 1))
    assert json.dumps(out) == json.dumps(
        {
            "now": 1772443000.5,
            "decisions": [
                {
                    "lease": "l1",
                    "user": "alice",
                    "server": "gpu",
                    "offer": "a100-3g",
                    "offer_name": "A100 (3 slices)",
                    "kind": "notice",
                    "reason": "idle for 30 minutes",
                    "action": "stop",
                    "deadline": "2026-03-02T09:16:30.250000Z",
                    "evidence": {"gpu": "idle", "verdict": "idle"},
                    "notice_kind": "idle",
                    "heading": "Idle GPU: it will be reclaimed",
                    "keep": True,
                },
                {
                    "lease": "l2",
                    "user": "bob",
                    "server": "",
                    "offer": "a100-3g",
                    "offer_name": "a100-3g",
                    "kind": "act",
                    "reason": "idle past the deadline",
                    "action": "shrink:a100-1g",
                    "deadline": "2026-03-02T09:15:00Z",
                    "release_reason": "reclaimed-idle",
                    "target_offer": "a100-1g",
                    "target_lease": "l3",
                    "evidence": {"verdict": "idle"},
                },
                {
                    "lease": "l4",
                    "user": "carol",
                    "server": "",
                    "offer": "h100",
                    "offer_name": "h100",
                    "kind": "stale",
                    "reason": "not reached",
                },
            ],
            "stale": 1,
        }
    )


def test_a_notice_that_cannot_be_kept_says_why_and_keep_false_is_written():
    drained = ReclaimDecisionView("l1", "alice", "", "h100", "h100", "notice", "drain",
                                  keep=False, why_not_kept="its node is drained")  # fmt: skip
    assert decision_json(drained) == {
        "lease": "l1",
        "user": "alice",
        "server": "",
        "offer": "h100",
        "offer_name": "h100",
        "kind": "notice",
        "reason": "drain",
        "keep": False,
        "why_not_kept": "its node is drained",
    }


def test_a_decision_is_built_from_the_pools_words_with_its_deadline_as_a_time():
    said = Said("l1", "notice", "idle for 30 minutes", {
        "action": "stop", "deadline": T1.replace(tzinfo=timezone.utc),
        "evidence": {"gpu": "idle", "verdict": "idle"}, "notice_kind": "idle",
        "heading": "Idle GPU: it will be reclaimed", "keep": True, "why_not_kept": None,
    })  # fmt: skip
    view = decision_view(Row(), "A100 (3 slices)", said)  # type: ignore[arg-type]
    assert view == NOTICE
    assert isinstance(view.deadline, datetime) and view.deadline.tzinfo is None  # the views'
    assert decision_json(view)["deadline"] == "2026-03-02T09:16:30.250000Z"  # text: served
    again = Said("l1", "act", "claimed long ago", {"action": "stop", "deadline": None})
    view = decision_view(Row(), "a100-3g", again)  # type: ignore[arg-type]
    assert (view.action, view.deadline, view.evidence) == ("stop", None, None)
    with pytest.raises(ValueError, match="urgency"):  # a new word of the rules needs a field
        decision_view(Row(), "x", Said("l1", "act", "", {"urgency": 1}))  # type: ignore[arg-type]


def test_a_rounds_view_counts_its_stale_decisions():
    view = round_view(12.0, iter([STALE, NOTICE, STALE]))
    assert (view.now, view.stale, [d.lease for d in view.decisions]) == (
        12.0,
        2,
        ["l4", "l1", "l4"],
    )


def test_an_enforced_notice_is_built_from_the_notice_rules_claim():
    claimed = {"lease": "l1", "user": "alice", "server": "one", "kind": "drain", "action": "stop",
               "deadline": datetime(2026, 3, 2, 10, 15, tzinfo=timezone(timedelta(hours=1))),
               "reason": "drained"}  # fmt: skip
    assert enforced_notice_view(claimed) == EnforcedNoticeView(
        "l1", "alice", "one", "drain", "stop", T0, "drained"
    )


def test_a_jobs_log_and_the_runners_upload_json():
    assert job_log_json(JobLogView(10, "epoch 1\n", 18, False)) == {
        "offset": 10,
        "data": "epoch 1\n",
        "next": 18,
        "complete": False,
    }
    assert job_log_appended_json(JobLogAppended(4096)) == {"next": 4096}


def test_a_server_address_json():
    assert server_url_json(ServerUrlView("l1", "http://10.0.0.7:8888/")) == {
        "lease": "l1",
        "server_url": "http://10.0.0.7:8888/",
    }
    assert server_url_json(ServerUrlView("l1", None)) == {"lease": "l1", "server_url": None}


def test_a_repartition_previews_json_is_the_plan_and_its_method():
    held = Held("7g.80gb", 0, "l1", "alice")
    plan = Plan("GPU-a", "A100-80GB", [("3g.40gb", 0)], go=[held], come=[("3g.40gb", 0)],
                in_way=[held])  # fmt: skip
    assert repartition_plan_json(RepartitionPlanView(plan, "agent")) == {
        "gpu": "GPU-a",
        "model": "A100-80GB",
        "layout": [{"profile": "3g.40gb", "start": 0}],
        "go": [{"profile": "7g.80gb", "start": 0, "lease": "l1", "user": "alice"}],
        "come": [{"profile": "3g.40gb", "start": 0}],
        "keep": [],
        "in_way": [{"profile": "7g.80gb", "start": 0, "lease": "l1", "user": "alice"}],
        "ready": False,
        "mig_config": {"3g.40gb": 1},
        "method": "agent",
    }


def test_a_mig_plans_json_keeps_the_pools_order():
    plan = mig_actions(
        [
            {"op": "destroy", "gpu": "GPU-a", "profile": "1g.10gb", "start": 3},
            {"op": "create", "gpu": "GPU-a", "profile": "7g.80gb", "start": 0},
        ]
    )
    assert plan == (
        MigAction("destroy", "GPU-a", "1g.10gb", 3),
        MigAction("create", "GPU-a", "7g.80gb", 0),
    )
    assert mig_plan_json(plan) == [
        {"op": "destroy", "gpu": "GPU-a", "profile": "1g.10gb", "start": 3},
        {"op": "create", "gpu": "GPU-a", "profile": "7g.80gb", "start": 0},
    ]


PAST = PastReclaimView(
    lease="l1",
    offer="h100",
    server="",
    at=T0,
    kind="idle",
    action="stop",
    reason="idle for 30 minutes",
    release_reason="reclaimed-idle",
    saved=("a.ipynb",),
    outcome="done",
    detail="saved 1",
    utilization=(ReclaimMinute(datetime(2026, 3, 2, 9, 5), None, 2048),),
)
ME = UserView(
    name="alice",
    groups=("ml",),
    quota=QuotaSpec(guarantee=Fraction(1), limit=Fraction(5, 2), budget=Fraction(100)),
    held_units=1.5,
    used_unit_hours=12.25,
    leases=(),
    notices=(UserNoticeView("l9", "the node is drained", "stop", T1),),
    reclaims=(PAST,),
    withdrawn=(WithdrawnNoticeView("l8", None, None, T1, "admin", ""),),
)


def test_a_users_json_with_notices_reclaims_and_withdrawn_notices():
    assert json.dumps(user_json(ME)) == json.dumps(
        {
            "name": "alice",
            "groups": ["ml"],
            "quota": {
                "guarantee": 1.0,
                "limit": 2.5,
                "budget": 100.0,
                "period": "month",
                "exception": None,
                "budget_action": "refuse",
                "budget_minimum": 0.0,
            },
            "held_units": 1.5,
            "used_unit_hours": 12.25,
            "leases": [],
            "notices": [
                {
                    "lease": "l9",
                    "kind": "reclaim",
                    "message": "the node is drained",
                    "reason": "the node is drained",
                    "action": "stop",
                    "deadline": "2026-03-02T09:16:30.250000Z",
                }
            ],
            "reclaims": [
                {
                    "lease": "l1",
                    "offer": "h100",
                    "server": "",
                    "at": "2026-03-02T09:15:00Z",
                    "kind": "idle",
                    "action": "stop",
                    "reason": "idle for 30 minutes",
                    "release_reason": "reclaimed-idle",
                    "saved": ["a.ipynb"],
                    "outcome": "done",
                    "detail": "saved 1",
                    "utilization": [
                        {
                            "minute": "2026-03-02T09:05:00Z",
                            "util_mean": None,
                            "memory_used_mib_max": 2048,
                        }
                    ],
                }
            ],
            "withdrawn": [
                {
                    "lease": "l8",
                    "offer": None,
                    "server": None,
                    "at": "2026-03-02T09:16:30.250000Z",
                    "kind": "admin",
                    "reason": "",
                }
            ],
        }
    )
    failed = past_reclaim_json(PastReclaimView("l2", None, None, T0, None, None, None, None, (),
                                               "failed", "", ()))  # fmt: skip
    assert (failed["outcome"], failed["release_reason"], failed["utilization"]) == (
        "failed",
        None,
        [],
    )


def test_the_answers_views_pickle_across_the_writers_pipe():
    plan = Plan("GPU-a", "A100-80GB", [("3g.40gb", 0)])
    views = (
        LeaderView("r1", T0, True),
        ReclaimRoundView(1.0, (NOTICE, ACT, STALE), 1),
        EnforcedNoticeView("l1", "alice", "one", "drain", "stop", T0, "drained"),
        JobLogView(0, "x", 1, True),
        JobLogAppended(1),
        ServerUrlView("l1", None),
        RepartitionPlanView(plan, "label"),
        MigAction("create", "GPU-a", "1g.10gb", 0),
        ME,
    )
    for view in views:
        assert pickle.loads(pickle.dumps(view)) == view

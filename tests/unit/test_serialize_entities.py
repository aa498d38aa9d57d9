"""The API's JSON of the store's read models (``service/serialize/``), against JSON written
out by hand: every wire name and time text, so a renamed field or a changed time format
fails here before a client sees it. The views cross the writer's process pipe, so they
pickle."""

from __future__ import annotations

import pickle
from datetime import datetime
from fractions import Fraction

from jupyterhub_gpupool.pool.quota import QuotaSpec
from jupyterhub_gpupool.pool.reclaimpolicy import ReclaimPolicy
from jupyterhub_gpupool.pool.repartition import Held, Plan
from jupyterhub_gpupool.service.serialize.jobs import job_json
from jupyterhub_gpupool.service.serialize.nodes import node_drain_json, node_json, node_set_json
from jupyterhub_gpupool.service.serialize.presence import presence_json
from jupyterhub_gpupool.service.serialize.quotas import quota_json
from jupyterhub_gpupool.service.serialize.reclaim import reclaim_policy_json
from jupyterhub_gpupool.service.serialize.repartitions import repartition_json
from jupyterhub_gpupool.store.read.jobs import JobDevice, JobMig, JobView, stored_devices
from jupyterhub_gpupool.store.read.nodes import NodeDrainView, NodeSetView, NodeView
from jupyterhub_gpupool.store.read.presence import PresenceView
from jupyterhub_gpupool.store.read.quotas import QuotaView
from jupyterhub_gpupool.store.read.reclaim import ReclaimPolicyView
from jupyterhub_gpupool.store.read.repartitions import LayoutSlice, RepartitionView

T0 = datetime(2026, 3, 2, 9, 15, 0)
T1 = datetime(2026, 3, 2, 9, 16, 30, 250000)

RUNNING_JOB = JobView(
    id="j1",
    user="bob",
    group="ml",
    name="train",
    offer="a100-1g",
    workload="training",
    replicas=2,
    command=("python", "train.py"),
    cwd="/home/bob",
    state="preempting",
    position=None,
    lease_id="l1",
    node="gpu-1",
    devices=(
        JobDevice("GPU-a", 0, JobMig("1g.10gb", 3, "MIG-x")),
        JobDevice("GPU-b", 1, None),
    ),
    created=T0,
    started=T1,
    ended=None,
    exit_code=None,
    notice_deadline=T1,
    reason="preempted for alice",
    runner="kueue",
    runner_ref={"namespace": "ml", "name": "train", "uid": "u1"},
    env={"SEED": "1"},
)


def test_a_running_jobs_json_with_devices_times_and_env():
    assert job_json(RUNNING_JOB) == {
        "id": "j1",
        "user": "bob",
        "group": "ml",
        "name": "train",
        "offer": "a100-1g",
        "class": "training",
        "replicas": 2,
        "command": ["python", "train.py"],
        "cwd": "/home/bob",
        "state": "preempting",
        "position": None,
        "lease_id": "l1",
        "node": "gpu-1",
        "devices": [
            {
                "gpu": "GPU-a",
                "index": 0,
                "mig": {"profile": "1g.10gb", "start": 3, "uuid": "MIG-x"},
            },
            {"gpu": "GPU-b", "index": 1, "mig": None},
        ],
        "created": "2026-03-02T09:15:00Z",
        "started": "2026-03-02T09:16:30.250000Z",
        "ended": None,
        "exit_code": None,
        "notice_deadline": "2026-03-02T09:16:30.250000Z",
        "reason": "preempted for alice",
        "runner": "kueue",
        "runner_ref": {"namespace": "ml", "name": "train", "uid": "u1"},
        "env": {"SEED": "1"},
    }


def test_a_queued_jobs_json_has_its_position_and_no_env_key():
    queued = JobView(
        id="j2", user="ann", group=None, name="", offer="h100", workload="inference",
        replicas=1, command=("serve",), cwd=None, state="queued", position=3, lease_id="l2",
        node=None, devices=(), created=T0, started=None, ended=None, exit_code=None,
        notice_deadline=None, reason=None, runner="local", runner_ref=None,
    )  # fmt: skip
    assert job_json(queued) == {
        "id": "j2",
        "user": "ann",
        "group": None,
        "name": "",
        "offer": "h100",
        "class": "inference",
        "replicas": 1,
        "command": ["serve"],
        "cwd": None,
        "state": "queued",
        "position": 3,
        "lease_id": "l2",
        "node": None,
        "devices": [],
        "created": "2026-03-02T09:15:00Z",
        "started": None,
        "ended": None,
        "exit_code": None,
        "notice_deadline": None,
        "reason": None,
        "runner": "local",
        "runner_ref": None,
    }


def test_a_jobs_recorded_devices_read_back_typed():
    recorded = [
        {"gpu": "GPU-a", "index": 2, "mig": {"profile": "3g.40gb", "start": 4, "uuid": None}},
        {"gpu": "GPU-b", "index": None, "mig": None},
    ]
    assert stored_devices(recorded) == (
        JobDevice("GPU-a", 2, JobMig("3g.40gb", 4, None)),
        JobDevice("GPU-b", None, None),
    )


NODE = NodeView("gpu-1", "default", cordoned=True, draining=False, unreachable=False, gpus=8,
                source="agent")  # fmt: skip
NODE_JSON = {
    "name": "gpu-1",
    "cluster": "default",
    "cordoned": True,
    "draining": False,
    "unreachable": False,
    "gpus": 8,
    "source": "agent",
}


def test_a_nodes_json():
    assert node_json(NODE) == NODE_JSON


def test_a_cordon_answers_the_node_and_an_uncordon_what_it_withdrew():
    assert node_set_json(NodeSetView(NODE)) == NODE_JSON
    assert node_set_json(NodeSetView(NODE, ("l1", "l2"))) == {
        **NODE_JSON,
        "withdrawn": ["l1", "l2"],
    }
    assert node_set_json(NodeSetView(NODE, ()))["withdrawn"] == []


def test_a_drains_answer_has_its_deadline_and_counts():
    assert node_drain_json(NodeDrainView(NODE, T0, noticed=2, released=1)) == {
        **NODE_JSON,
        "deadline": "2026-03-02T09:15:00Z",
        "noticed": 2,
        "released": 1,
    }
    assert node_drain_json(NodeDrainView(NODE, None, 0, 0))["deadline"] is None


SHRINK = ReclaimPolicy(
    idle_timeout=7200.0,
    max_age=86400.0,
    action="shrink:a100-1g",
    exempt_users=frozenset({"zoe", "ann"}),
    exempt_groups=frozenset({"staff"}),
)
POLICIES = ReclaimPolicyView(
    source="api",
    section={"default": {"idle_timeout": "2h"}},
    default=ReclaimPolicy(),
    offers={"a100-3g": SHRINK},
)


def test_the_reclaim_policies_json_resolves_every_field():
    assert reclaim_policy_json(POLICIES) == {
        "source": "api",
        "reclaim": {"default": {"idle_timeout": "2h"}},
        "effective": {
            "default": {
                "enabled": True,
                "idle_timeout": 1800.0,
                "pressure_idle_timeout": 1200.0,
                "cpu_busy_timeout": 14400.0,
                "warn_before": 600.0,
                "max_extensions": 2,
                "extension": 3600.0,
                "max_age": None,
                "busy_grace": 900.0,
                "min_runtime": 1800.0,
                "gpu_idle_threshold": 5.0,
                "action": "stop",
                "exempt_users": [],
                "exempt_groups": [],
                "reclaim_busy_borrowed": False,
            },
            "offers": {
                "a100-3g": {
                    "enabled": True,
                    "idle_timeout": 7200.0,
                    "pressure_idle_timeout": 1200.0,
                    "cpu_busy_timeout": 14400.0,
                    "warn_before": 600.0,
                    "max_extensions": 2,
                    "extension": 3600.0,
                    "max_age": 86400.0,
                    "busy_grace": 900.0,
                    "min_runtime": 1800.0,
                    "gpu_idle_threshold": 5.0,
                    "action": "shrink:a100-1g",
                    "exempt_users": ["ann", "zoe"],
                    "exempt_groups": ["staff"],
                    "reclaim_busy_borrowed": False,
                }
            },
        },
    }


WAITING = RepartitionView(
    id=7,
    node="a100",
    gpu="GPU-a",
    layout=(LayoutSlice("3g.40gb", 0), LayoutSlice("3g.40gb", 4)),
    method="label",
    state="waiting",
    actor="user:admin",
    created=T0,
    updated=T1,
    error=None,
    plan=Plan(
        gpu="GPU-a",
        model="A100-80GB",
        target=[("3g.40gb", 0), ("3g.40gb", 4)],
        go=[Held("7g.80gb", 0, "l1", "alice")],
        come=[("3g.40gb", 0), ("3g.40gb", 4)],
        in_way=[Held("7g.80gb", 0, "l1", "alice")],
    ),
)


def test_a_waiting_repartitions_json_has_its_plan():
    held = {"profile": "7g.80gb", "start": 0, "lease": "l1", "user": "alice"}
    two = [{"profile": "3g.40gb", "start": 0}, {"profile": "3g.40gb", "start": 4}]
    assert repartition_json(WAITING) == {
        "id": 7,
        "node": "a100",
        "gpu": "GPU-a",
        "layout": two,
        "method": "label",
        "state": "waiting",
        "actor": "user:admin",
        "created": "2026-03-02T09:15:00Z",
        "updated": "2026-03-02T09:16:30.250000Z",
        "error": None,
        "plan": {
            "gpu": "GPU-a",
            "model": "A100-80GB",
            "layout": two,
            "go": [held],
            "come": two,
            "keep": [],
            "in_way": [held],
            "ready": False,
            "mig_config": {"3g.40gb": 2},
        },
    }


def test_a_closed_repartitions_json_has_no_plan_and_says_why_it_failed():
    failed = RepartitionView(7, "a100", "GPU-a", (LayoutSlice("7g.80gb", 0),), "agent",
                             "failed", "user:admin", T0, T1, "no such profile", None)  # fmt: skip
    out = repartition_json(failed)
    assert out["plan"] is None and out["error"] == "no such profile"
    assert out["layout"] == [{"profile": "7g.80gb", "start": 0}] and out["method"] == "agent"


BUDGETED = QuotaView(
    name="ml",
    kind="group",
    source="api",
    spec=QuotaSpec(
        guarantee=Fraction(1, 2),
        limit=Fraction(3),
        budget=Fraction(40),
        period="week",
        exception=Fraction(4),
        budget_action="stop",
        budget_minimum=Fraction(1, 4),
    ),
)


def test_a_quotas_json_has_every_field_in_units_and_its_source():
    assert quota_json(BUDGETED) == {
        "name": "ml",
        "kind": "group",
        "source": "api",
        "guarantee": 0.5,
        "limit": 3.0,
        "budget": 40.0,
        "period": "week",
        "exception": 4.0,
        "budget_action": "stop",
        "budget_minimum": 0.25,
    }
    assert list(quota_json(BUDGETED)) == [
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
    ]  # the order the API has always written


def test_no_quota_is_json_nulls_and_the_defaults():
    assert quota_json(QuotaView("bob", "user", "none", QuotaSpec())) == {
        "name": "bob",
        "kind": "user",
        "source": "none",
        "guarantee": 0.0,
        "limit": None,
        "budget": None,
        "period": "month",
        "exception": None,
        "budget_action": "refuse",
        "budget_minimum": 0.0,
    }


def test_a_lab_reports_presence_json_has_its_last_input():
    assert presence_json(PresenceView("l1", "lab", T1)) == {
        "lease": "l1",
        "source": "lab",
        "last_input": "2026-03-02T09:16:30.250000Z",
    }
    assert presence_json(PresenceView("l1", None, None)) == {
        "lease": "l1",
        "source": None,
        "last_input": None,
    }


def test_views_pickle_across_the_writers_pipe():
    drained = NodeDrainView(NODE, T0, 2, 1)
    presence = PresenceView("l1", "lab", T1)
    views = (
        RUNNING_JOB,
        NodeSetView(NODE, ("l1",)),
        drained,
        POLICIES,
        WAITING,
        BUDGETED,
        presence,
    )
    for view in views:
        assert pickle.loads(pickle.dumps(view)) == view

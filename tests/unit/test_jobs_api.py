"""Job leases over HTTP, through the service's real tornado app and writer on the store's
injectable clock (the hub's token check played by a fake): submit → granted or queued, the
runner's reports (running, exited) releasing the lease, cancel, logs, the refusals, preemption
of a training job for an interactive request within guarantee (and never of inference), the
reconcile leaving live jobs alone, and usage per job."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, USE
from tests.fakes import InProcessService, StoreClock, make_store

#: Two H100s; alice (interactive) has a guarantee of one, trainer none (training borrows);
#: inference is for the group `serving` only.
POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "h100",
            "cpu_milli": 64000,
            "memory_mib": 262144,
            "gpus": [{"model": "H100-80GB", "count": 2}],
        }
    ],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {
        "default": {"guarantee": 0, "limit": 2},
        "users": {"alice": {"guarantee": 1, "limit": 2}},
    },
    "classes": {"inference": {"allowed_groups": ["serving"]}, "training": {"grace": 120}},
}


def _user(name: str, *groups: str) -> dict[str, Any]:
    return {"kind": "user", "name": name, "scopes": [f"{USE}!user={name}"], "groups": list(groups)}


MODELS: dict[str, dict[str, Any]] = {
    "alice": _user("alice"),
    "bob": _user("bob"),
    "trainer": _user("trainer", "ml"),
    "server": _user("server", "serving"),
    "runner": {"kind": "service", "name": "gpupool-agent", "scopes": [AGENT]},
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
}


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(db_url)
    with InProcessService(make_store(db_url, clock, POOL), MODELS) as service:
        yield service


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, r.body
    return r.json()


def submit(svc: InProcessService, who: str = "trainer", **body: Any) -> dict[str, Any]:
    body = {"offer": "h100", "command": ["python", "train.py"], **body}
    return ok(svc.call(who, "POST", "jobs", body), 201)


def lease(svc: InProcessService, lease_id: str) -> dict[str, Any]:
    return ok(svc.call("root", "GET", f"allocations/{lease_id}"))


def report(svc: InProcessService, job: dict[str, Any], state: str, **kw: Any) -> dict[str, Any]:
    return ok(svc.call("runner", "POST", f"jobs/{job['id']}/status", {"state": state, **kw}))


def test_a_job_runs_to_its_end_and_its_lease_is_released_with_usage(svc, clock):
    job = submit(svc, name="resnet", env={"SEED": "1"})
    assert job["state"] == "granted" and job["class"] == "training" and job["node"] == "h100"
    assert job["command"] == ["python", "train.py"] and job["position"] is None
    assert [d["index"] for d in job["devices"]] == [0] and job["devices"][0]["mig"] is None
    held = lease(svc, job["lease_id"])
    assert held["server"] == f"job:{job['id']}" and held["expires"] is None
    # the runner's list carries what it needs to start it
    listed = ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"]
    assert [(j["id"], j["env"]) for j in listed] == [(job["id"], {"SEED": "1"})]
    assert ok(svc.call("runner", "GET", "nodes/other/jobs"))["jobs"] == []
    clock.advance(minutes=1)
    running = report(svc, job, "running", pid=4242)
    assert running["state"] == "running" and running["started"]
    assert lease(svc, job["lease_id"])["state"] == "active"
    assert ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"] == []  # nothing to do
    # logs: appended by the runner, read by the user from an offset
    assert ok(svc.call("runner", "POST", f"jobs/{job['id']}/logs", {"offset": 0, "data": "ab"}))
    r = svc.call("runner", "POST", f"jobs/{job['id']}/logs", {"offset": 1, "data": "bcd"})
    assert ok(r) == {"next": 4}  # the overlap is not written twice
    r = svc.call("runner", "POST", f"jobs/{job['id']}/logs", {"offset": 9, "data": "x"})
    assert r.status == 422 and r.json()["error"]["field"] == "offset"
    logs = ok(svc.call("trainer", "GET", f"jobs/{job['id']}/logs?offset=1"))
    assert logs == {"offset": 1, "data": "bcd", "next": 4, "complete": False}
    clock.advance(hours=1)
    ended = report(svc, job, "exited", exit_code=0)
    assert ended["state"] == "succeeded" and ended["exit_code"] == 0 and ended["ended"]
    released = lease(svc, job["lease_id"])
    assert released["state"] == "released" and released["release_reason"] == "stopped"
    assert ok(svc.call("trainer", "GET", f"jobs/{job['id']}/logs"))["complete"]
    # a late report is refused: the runner stops what it still runs of it
    r = svc.call("runner", "POST", f"jobs/{job['id']}/status", {"state": "running"})
    assert r.status == 409 and r.json()["error"]["code"] == "job_not_running"
    # usage per job, with its name
    start = (clock.now - timedelta(hours=3)).isoformat() + "Z"
    end = (clock.now + timedelta(minutes=1)).isoformat() + "Z"
    usage = ok(svc.call("root", "GET", f"usage?by=job&from={start}&to={end}"))
    rows = {row["job"]: row for row in usage["items"]}
    row = rows[f"job:{job['id']}"]
    assert row["name"] == "resnet" and row["kind"] == "job"
    assert row["held_unit_hours"] == pytest.approx(61 / 60, abs=1e-3)
    r = svc.call("root", "GET", f"usage?by=job&format=csv&from={start}&to={end}")
    assert r.status == 200 and r.body.decode().splitlines()[0].startswith("job,name,kind,")
    assert f"job:{job['id']},resnet,job," in r.body.decode()


def test_a_failing_job_fails_with_its_exit_code(svc):
    job = submit(svc)
    report(svc, job, "running")
    ended = report(svc, job, "exited", exit_code=3)
    assert ended["state"] == "failed" and ended["reason"] == "exit code 3"


def test_cancel_a_queued_job_and_a_running_one(svc):
    first, second = submit(svc), submit(svc)
    third = submit(svc)  # the pool is full: queued, with its place
    assert third["state"] == "queued" and third["position"] == 1
    assert ok(svc.call("trainer", "GET", "jobs?state=queued"))["jobs"][0]["id"] == third["id"]
    cancelled = ok(svc.call("trainer", "DELETE", f"jobs/{third['id']}"))
    assert cancelled["state"] == "cancelled"
    assert lease(svc, third["lease_id"])["release_reason"] == "cancelled"
    # a granted job that never ran ends at once; its lease goes
    assert ok(svc.call("trainer", "DELETE", f"jobs/{second['id']}"))["state"] == "cancelled"
    assert lease(svc, second["lease_id"])["state"] == "released"
    # a running one: its runner stops it, then reports the exit
    report(svc, first, "running")
    assert ok(svc.call("trainer", "DELETE", f"jobs/{first['id']}"))["state"] == "cancelling"
    listed = ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"]
    assert [(j["id"], j["state"]) for j in listed] == [(first["id"], "cancelling")]
    assert lease(svc, first["lease_id"])["state"] == "active"  # until the exit is reported
    assert report(svc, first, "exited", exit_code=-15)["state"] == "cancelled"
    assert lease(svc, first["lease_id"])["state"] == "released"


def test_others_see_no_job_of_someone_else(svc):
    job = submit(svc)
    for method in ("GET", "DELETE"):
        r = svc.call("bob", method, f"jobs/{job['id']}")
        assert r.status == 404 and r.json()["error"]["code"] == "not_found"
    assert ok(svc.call("bob", "GET", "jobs"))["jobs"] == []
    r = svc.call("bob", "GET", "jobs?user=trainer")
    assert r.status == 403
    assert [j["id"] for j in ok(svc.call("root", "GET", "jobs"))["jobs"]] == [job["id"]]
    r = svc.call("trainer", "POST", f"jobs/{job['id']}/status", {"state": "running"})
    assert r.status == 403  # the runner's side is the agent's


@pytest.mark.parametrize(
    ("body", "status", "code"),
    [
        ({"command": []}, 400, "invalid_command"),
        ({"command": None}, 400, "invalid_command"),
        ({"command": "python train.py"}, 400, "invalid_command"),
        ({"env": ["SEED=1"]}, 400, "invalid_env"),
        ({"name": 5}, 422, "invalid_field"),
        ({"command": ["python", 1]}, 400, "invalid_command"),
        ({"env": {"CUDA_VISIBLE_DEVICES": "3"}}, 400, "invalid_env"),
        ({"class": "batch"}, 400, "unknown_class"),
        ({"class": "inference"}, 403, "class_not_allowed"),
        ({"offer": "a100"}, 422, "unknown_offer"),
        ({"runtime": 5}, 422, "unknown_field"),
        ({"image": "two words"}, 400, "invalid_image"),
        ({"image": ""}, 400, "invalid_image"),
        ({"image": 5}, 422, "invalid_field"),
        ({"replicas": 2}, 400, "invalid_replicas"),  # training has no replicas
        ({"replicas": 0}, 400, "invalid_replicas"),
        ({"replicas": "2"}, 400, "invalid_replicas"),
        ({"replicas": 1.5}, 400, "invalid_replicas"),
        ({"replicas": None}, 400, "invalid_replicas"),
    ],
)
def test_bad_submissions_get_a_4xx_with_a_code(svc, body, status, code):
    payload = {"offer": "h100", "command": ["python", "train.py"], **body}
    if "command" in body and body["command"] is None:
        del payload["command"]
    r = svc.call("trainer", "POST", "jobs", payload)
    assert r.status == status, r.body
    assert r.json()["error"]["code"] == code


def test_an_interactive_request_within_guarantee_preempts_the_youngest_training_job(svc, clock):
    old = submit(svc, name="old")
    clock.advance(seconds=10)
    young = submit(svc, name="young")
    for job in (old, young):
        report(svc, job, "running")
    assert svc.run(commands.PreemptJobs()) == []  # nobody waits
    nb = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    assert nb["state"] == "queued"
    clock.advance(seconds=5)
    assert svc.run(commands.PreemptJobs()) == [young["id"]]
    noticed = ok(svc.call("trainer", "GET", f"jobs/{young['id']}"))
    assert noticed["state"] == "preempting" and "alice" in noticed["reason"]
    deadline = (clock.now + timedelta(seconds=120)).isoformat() + "Z"
    assert noticed["notice_deadline"].replace("+00:00", "Z").startswith(deadline[:19])
    # the runner learns of it; a second round gives no second notice
    listed = ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"]
    assert [(j["id"], j["state"]) for j in listed] == [(young["id"], "preempting")]
    assert svc.run(commands.PreemptJobs()) == []
    assert ok(svc.call("trainer", "GET", f"jobs/{old['id']}"))["state"] == "running"
    events = ok(svc.call("root", "GET", "events?kind=job-preempting"))["items"]
    assert [e["data"]["job"] for e in events] == [young["id"]]
    # the runner stops it and reports the exit: the lease goes to alice
    report(svc, young, "running")  # heartbeats keep it preempting
    assert report(svc, young, "exited", exit_code=143)["state"] == "preempted"
    assert lease(svc, young["lease_id"])["release_reason"] == "preempted"
    assert lease(svc, nb["id"])["state"] == "granted"


def test_a_granted_job_that_never_started_is_preempted_at_once(svc, clock):
    report(svc, submit(svc), "running")
    clock.advance(seconds=1)
    waiting = submit(svc)  # granted, the runner has not started it yet: the youngest
    nb = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    assert svc.run(commands.PreemptJobs()) == [waiting["id"]]
    assert ok(svc.call("trainer", "GET", f"jobs/{waiting['id']}"))["state"] == "preempted"
    assert lease(svc, nb["id"])["state"] == "granted"


def test_inference_is_never_preempted(svc):
    jobs = [submit(svc, "server", **{"class": "inference"}) for _ in range(2)]
    for job in jobs:
        report(svc, job, "running")
    nb = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    assert nb["state"] == "queued"
    assert svc.run(commands.PreemptJobs()) == []
    assert {ok(svc.call("server", "GET", f"jobs/{j['id']}"))["state"] for j in jobs} == {"running"}
    assert lease(svc, nb["id"])["state"] == "queued"


def test_a_training_request_preempts_nothing(svc):
    for _ in range(2):
        report(svc, submit(svc), "running")
    queued = submit(svc)
    assert queued["state"] == "queued"
    assert svc.run(commands.PreemptJobs()) == []


def test_reconcile_leaves_a_live_job_alone_and_releases_one_whose_runner_went_silent(svc, clock):
    live, silent = submit(svc), submit(svc)
    report(svc, live, "running")
    report(svc, silent, "running")
    clock.advance(seconds=100)
    report(svc, live, "running")
    # the hub runs no server at all: job leases are not its to release
    assert svc.run(commands.Reconcile(set())) == 0
    clock.advance(seconds=30)  # silent: 130 s without a report; live: 30 s
    assert svc.run(commands.Reconcile(set())) == 1
    lost = ok(svc.call("trainer", "GET", f"jobs/{silent['id']}"))
    assert lost["state"] == "failed" and lost["reason"] == "runner_lost"
    assert lease(svc, silent["lease_id"])["state"] == "released"
    assert ok(svc.call("trainer", "GET", f"jobs/{live['id']}"))["state"] == "running"
    assert lease(svc, live["lease_id"])["state"] == "active"


def test_a_preempted_job_gets_its_grace_before_the_runner_timeout_counts(svc, clock):
    other = submit(svc)
    report(svc, other, "running")
    clock.advance(seconds=1)
    job = submit(svc)
    report(svc, job, "running")
    ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    assert svc.run(commands.PreemptJobs()) == [job["id"]]
    clock.advance(seconds=120 + 100)  # past the deadline, not yet by the timeout
    report(svc, other, "running")
    svc.run(commands.Reconcile(set()))
    assert ok(svc.call("trainer", "GET", f"jobs/{job['id']}"))["state"] == "preempting"
    clock.advance(seconds=30)
    report(svc, other, "running")
    svc.run(commands.Reconcile(set()))
    lost = ok(svc.call("trainer", "GET", f"jobs/{job['id']}"))
    assert lost["state"] == "failed" and lost["reason"] == "runner_lost"
    assert ok(svc.call("trainer", "GET", f"jobs/{other['id']}"))["state"] == "running"


def test_an_admins_release_of_a_job_lease_ends_the_job(svc):
    job = submit(svc)
    report(svc, job, "running")
    ok(svc.call("root", "DELETE", f"allocations/{job['lease_id']}?reason=admin"))
    ended = ok(svc.call("trainer", "GET", f"jobs/{job['id']}"))
    assert ended["state"] == "cancelled" and ended["reason"] == "lease ended: admin"
    assert ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"] == []


def test_a_restarted_pool_gives_runners_the_whole_timeout_again(db_url, clock):
    """Runners cannot report to a pool that is down: silence counts from its start."""
    upgrade(db_url)
    store = make_store(db_url, clock, POOL)
    job = store.submit_job("trainer", "h100", ["python", "train.py"])
    store.job_status(job.id, "running")
    clock.advance(minutes=10)  # the pool is down for ten minutes
    restarted = make_store(db_url, clock, POOL)
    assert restarted.reconcile(set()) == 0
    assert restarted.job(job.id).state == "running"
    clock.advance(seconds=121)
    assert restarted.reconcile(set()) == 1
    assert restarted.job(job.id).reason == "runner_lost"


def test_a_preemption_round_with_nothing_to_do_writes_nothing(db_url, clock):
    """Most rounds of most pools: no version bump, so no other process catches up."""
    upgrade(db_url)
    store = make_store(db_url, clock, POOL)
    for _ in range(2):
        store.submit_job("server", "h100", ["serve"], "inference", groups=["serving"])
    store.allocate("alice", "", "h100")  # waits; only inference runs
    with store.read() as db:
        before = db.scalar(select(orm.PoolState.version))
    assert store.preempt_jobs() == []
    with store.read() as db:
        assert db.scalar(select(orm.PoolState.version)) == before


def test_a_job_being_cancelled_makes_the_room_and_stays_cancelling(svc, clock):
    old = submit(svc)
    clock.advance(seconds=1)
    young = submit(svc)
    for job in (old, young):
        report(svc, job, "running")
    ok(svc.call("trainer", "DELETE", f"jobs/{old['id']}"))  # leaving anyway
    ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    assert svc.run(commands.PreemptJobs()) == []  # the leaving one is the room: no notice
    states = {j["id"]: j["state"] for j in ok(svc.call("trainer", "GET", "jobs"))["jobs"]}
    assert states == {old["id"]: "cancelling", young["id"]: "running"}


def test_a_job_lease_cannot_be_resized_or_kept_alive_as_a_server(svc):
    job = submit(svc)
    for path, body in (("resize", {"offer": "h100"}), ("keepalive", {})):
        r = svc.call("trainer", "POST", f"allocations/{job['lease_id']}/{path}", body)
        assert r.status == 409 and r.json()["error"]["code"] == "job_lease", r.body
    assert lease(svc, job["lease_id"])["state"] == "granted"


def test_a_job_without_a_name_is_named_after_its_program(svc):
    job = submit(svc, command=["/opt/venv/bin/" + "x" * 300, "--fast"])
    assert job["name"].startswith("x" * 200 + "-") and len(job["name"]) == 207
    assert ok(svc.call("trainer", "GET", f"jobs/{job['id']}"))["name"] == job["name"]


def test_the_pool_keeps_the_last_mebibyte_of_a_jobs_output(svc):
    job = submit(svc)
    path = f"jobs/{job['id']}/logs"
    big = "a" * (1024 * 1024)
    assert ok(svc.call("runner", "POST", path, {"offset": 0, "data": big})) == {"next": len(big)}
    assert ok(svc.call("runner", "POST", path, {"offset": len(big), "data": "tail"}))
    logs = ok(svc.call("trainer", "GET", f"{path}?offset=0"))  # before what is kept
    assert logs["offset"] == 4 and logs["next"] == len(big) + 4
    assert len(logs["data"]) == 1024 * 1024 and logs["data"].endswith("atail")


def test_a_drain_by_a_deadline_stops_jobs_through_their_runner(svc, clock):
    job = submit(svc, "server", **{"class": "inference"})  # never preempted, but drained
    report(svc, job, "running")
    deadline = (clock.now + timedelta(minutes=10)).isoformat() + "Z"
    ok(svc.call("root", "POST", "nodes/h100/drain", {"deadline": deadline}))
    assert svc.run(commands.PreemptJobs()) == [job["id"]]
    noticed = ok(svc.call("server", "GET", f"jobs/{job['id']}"))
    assert noticed["state"] == "preempting" and noticed["notice_deadline"].startswith(deadline[:19])
    clock.advance(minutes=30)  # long past the deadline: the service never asks the hub
    assert svc.run(commands.EnforceNotices(0)) == []
    assert report(svc, job, "exited", exit_code=143)["state"] == "preempted"
    assert lease(svc, job["lease_id"])["state"] == "released"


def test_a_job_with_an_image_is_kubernetes_and_the_local_runner_never_sees_it(svc):
    job = submit(svc, image="nvcr.io/nvidia/pytorch:25.01-py3")
    assert job["runner"] == "kubernetes"
    assert job["runner_ref"] == {"image": "nvcr.io/nvidia/pytorch:25.01-py3"}
    assert ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"] == []
    local = submit(svc)
    assert local["runner"] == "local" and local["runner_ref"] is None
    assert [j["id"] for j in ok(svc.call("runner", "GET", "nodes/h100/jobs"))["jobs"]] == [
        local["id"]
    ]


def test_inference_replicas_count_against_the_quota_usage_and_a_restart(db_url, clock, svc):
    job = submit(svc, "server", replicas=2, **{"class": "inference"})
    assert job["replicas"] == 2 and job["state"] == "granted"
    assert len({d["gpu"] for d in job["devices"]}) == 2  # both copies' devices
    held = lease(svc, job["lease_id"])
    assert held["offer"] == "h100" and held["units"] == 2
    # three copies need three GPUs on one node: never here
    r = svc.call("server", "POST", "jobs", {"offer": "h100", "command": ["serve"],
                                            "class": "inference", "replicas": 3})  # fmt: skip
    assert r.status == 422 and r.json()["error"]["code"] == "exceeds_node_size"
    # the two copies are the user's limit of 2: one more GPU waits for quota
    more = submit(svc, "server", **{"class": "inference"})
    assert more["state"] == "queued" and more["replicas"] == 1
    assert lease(svc, more["lease_id"])["reason"] == "quota"
    r = svc.call("server", "POST", "jobs", {"offer": "h100", "command": ["serve"],
                                            "class": "inference", "replicas": 65})  # fmt: skip
    assert r.status == 400 and r.json()["error"]["field"] == "replicas"
    # a restarted pool reads the copies back: still two units held
    restarted = make_store(db_url, clock, POOL)
    with restarted.locked() as alloc:
        assert alloc.quotas.held("server") == 2
        assert alloc.leases[job["lease_id"]].request.replicas == 2
    report(svc, job, "running")
    clock.advance(hours=1)
    report(svc, job, "exited", exit_code=0)
    start = (clock.now - timedelta(hours=2)).isoformat() + "Z"
    end = (clock.now + timedelta(minutes=1)).isoformat() + "Z"
    rows = ok(svc.call("root", "GET", f"usage?by=job&from={start}&to={end}"))["items"]
    row = next(r for r in rows if r["job"] == f"job:{job['id']}")
    assert row["held_unit_hours"] == pytest.approx(2.0, abs=1e-3)  # two GPUs for an hour

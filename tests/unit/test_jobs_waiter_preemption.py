"""A long-waiting 8-GPU training preempts, with the notice, the borrowed 1-GPU trainings on
the node held for it (``PreemptJobs`` → ``JobStore.preempt_jobs`` with
``workloads.waiter_preemption_rank``), over HTTP through the service's real app and writer on
the store's injectable clock; with ``classes.training.preempt_for_waiters: false`` it waits."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, USE
from tests.fakes import InProcessService, StoreClock, make_store

GRACE = 120
#: Two nodes of eight H100s; alice is guaranteed one GPU, trainer nothing (training borrows).
POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": name,
            "cpu_milli": 128000,
            "memory_mib": 1048576,
            "gpus": [{"model": "H100-80GB", "count": 8}],
        }
        for name in ("a", "b")
    ],
    "offers": [
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "h100x8", "kind": "gpu", "count": 8, "models": ["H100-80GB"]},
    ],
    "quotas": {
        "default": {"guarantee": 0, "limit": 32},
        "users": {"alice": {"guarantee": 1, "limit": 2}},
    },
    "classes": {"training": {"grace": GRACE}},
}
MODELS: dict[str, dict[str, Any]] = {
    name: {"kind": "user", "name": name, "scopes": [f"{USE}!user={name}"], "groups": []}
    for name in ("alice", "trainer")
}
MODELS["runner"] = {"kind": "service", "name": "gpupool-agent", "scopes": [AGENT]}
MODELS["root"] = {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []}


def service(db_url: str, clock: StoreClock, pool: dict[str, Any]) -> InProcessService:
    upgrade(db_url)
    return InProcessService(make_store(db_url, clock, pool, reserve_after=1800.0), MODELS)


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    with service(db_url, clock, POOL) as s:
        yield s


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, r.body
    return r.json()


def submit(svc: InProcessService, offer: str = "h100", name: str = "") -> dict[str, Any]:
    body = {"offer": offer, "command": ["python", "train.py"], "name": name or offer}
    return ok(svc.call("trainer", "POST", "jobs", body), 201)


def report(svc: InProcessService, job: dict[str, Any], state: str, **kw: Any) -> dict[str, Any]:
    return ok(svc.call("runner", "POST", f"jobs/{job['id']}/status", {"state": state, **kw}))


def job(svc: InProcessService, job_id: str) -> dict[str, Any]:
    return ok(svc.call("trainer", "GET", f"jobs/{job_id}"))


def fill(svc: InProcessService, clock: StoreClock) -> tuple[list[dict], list[dict], dict]:
    """a: alice's server (within guarantee) and seven trainings; b: two trainings; then an
    8-GPU training that fits nowhere."""
    nb = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    jobs = []
    for n in range(9):
        clock.advance(seconds=1)
        jobs.append(submit(svc, name=f"small-{n}"))
        report(svc, jobs[-1], "running")
    on_a = [j for j in jobs if j["node"] == "a"]
    on_b = [j for j in jobs if j["node"] == "b"]
    assert len(on_a) == 7 and len(on_b) == 2, [j["node"] for j in jobs]
    big = submit(svc, "h100x8", "big")
    assert big["state"] == "queued"
    return on_a, on_b, {"big": big, "nb": nb}


def test_a_long_waiting_8_gpu_training_preempts_the_two_on_its_held_node(svc, clock):
    on_a, on_b, asks = fill(svc, clock)
    big = asks["big"]
    assert svc.run(commands.PreemptJobs()) == []  # not waiting long yet
    clock.advance(seconds=1801)
    for j in on_a + on_b:
        report(svc, j, "running")
    noticed = svc.run(commands.PreemptJobs())
    # node b holds nothing within guarantee: it is held for the 8-GPU job, and its two
    # borrowed trainings get the class's notice; node a (alice's server) is never touched
    assert sorted(noticed) == sorted(j["id"] for j in on_b)
    deadline = (clock.now + timedelta(seconds=GRACE)).isoformat() + "Z"
    for j in on_b:
        got = job(svc, j["id"])
        assert got["state"] == "preempting" and "waited long" in got["reason"]
        assert got["notice_deadline"].replace("+00:00", "Z").startswith(deadline[:19])
    assert {job(svc, j["id"])["state"] for j in on_a} == {"running"}
    events = ok(svc.call("root", "GET", "events?kind=job-preempting"))["items"]
    assert sorted(e["data"]["job"] for e in events) == sorted(noticed)
    assert {e["data"]["for_request"] for e in events} == {big["lease_id"]}
    assert svc.run(commands.PreemptJobs()) == []  # no second notice
    # b is remembered as held for it, in the row too: a rebuilt allocator holds b as well
    lid = big["lease_id"]
    with svc.store.session_factory() as db:
        assert db.get(orm.LeaseRow, lid).held_node == "b"
        assert svc.store._rebuild(db).waiters[lid].hold == "b"
    # the runner stops them at their checkpoint: the 8-GPU job gets node b
    for j in on_b:
        assert report(svc, j, "exited", exit_code=143)["state"] == "preempted"
    got = job(svc, big["id"])
    assert got["state"] == "granted" and got["node"] == "b"
    with svc.store.session_factory() as db:
        assert db.get(orm.LeaseRow, lid).held_node is None  # granted: it holds nothing
    alloc = ok(svc.call("root", "GET", f"allocations/{asks['nb']['id']}"))
    assert alloc["state"] == "granted"


def test_with_the_option_off_the_long_waiter_only_waits(db_url, clock):
    pool = copy.deepcopy(POOL)
    pool["classes"]["training"]["preempt_for_waiters"] = False
    with service(db_url, clock, pool) as svc:
        on_a, on_b, asks = fill(svc, clock)
        clock.advance(seconds=1801)
        assert svc.run(commands.PreemptJobs()) == []
        assert {job(svc, j["id"])["state"] for j in on_a + on_b} == {"running"}
        assert job(svc, asks["big"]["id"])["state"] == "queued"

"""The headroom end to end (``borrowing: {keep_free: 1}``, ``pool.headroom``): borrowed
trainings leave one H100 free, a notebook within guarantee takes it at once, and
``PreemptJobs`` (``JobStore.preempt_jobs``) gives the youngest training its notice so the next
notebook finds one free too; over HTTP through the service's real app and writer on the
store's injectable clock, with the allocator rebuilt from the rows between rounds."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, USE
from tests.fakes import InProcessService, StoreClock, make_store

#: One node of four H100s; alice is guaranteed one GPU, trainer nothing (training borrows).
POOL: dict[str, Any] = {
    "nodes": [
        {
            "name": "a",
            "cpu_milli": 128000,
            "memory_mib": 1048576,
            "gpus": [{"model": "H100-80GB", "count": 4}],
        }
    ],
    "offers": [{"name": "h100", "kind": "gpu", "models": ["H100-80GB"]}],
    "quotas": {
        "default": {"guarantee": 0, "limit": 8},
        "users": {"alice": {"guarantee": 1, "limit": 2}},
    },
    "borrowing": {"keep_free": 1},
}
MODELS: dict[str, dict[str, Any]] = {
    name: {"kind": "user", "name": name, "scopes": [f"{USE}!user={name}"], "groups": []}
    for name in ("alice", "trainer")
}
MODELS["runner"] = {"kind": "service", "name": "gpupool-agent", "scopes": [AGENT]}
MODELS["root"] = {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []}


def service(db_url: str, clock: StoreClock, pool: dict[str, Any]) -> InProcessService:
    upgrade(db_url)
    return InProcessService(make_store(db_url, clock, pool), MODELS)


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    with service(db_url, clock, POOL) as s:
        yield s


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, r.body
    return r.json()


def submit(svc: InProcessService, name: str) -> dict[str, Any]:
    body = {"offer": "h100", "command": ["python", "train.py"], "name": name}
    return ok(svc.call("trainer", "POST", "jobs", body), 201)


def report(svc: InProcessService, job: dict[str, Any], state: str, **kw: Any) -> dict[str, Any]:
    return ok(svc.call("runner", "POST", f"jobs/{job['id']}/status", {"state": state, **kw}))


def job(svc: InProcessService, job_id: str) -> dict[str, Any]:
    return ok(svc.call("trainer", "GET", f"jobs/{job_id}"))


def lease(svc: InProcessService, lease_id: str) -> dict[str, Any]:
    return ok(svc.call("root", "GET", f"allocations/{lease_id}"))


def test_trainings_leave_one_gpu_free_and_the_refill_keeps_it_free(svc, clock):
    jobs = []
    for n in range(4):
        clock.advance(seconds=1)
        jobs.append(submit(svc, f"t{n}"))
    assert [j["state"] for j in jobs] == ["granted", "granted", "granted", "queued"]
    held = lease(svc, jobs[3]["lease_id"])
    assert held["reason"] == "headroom" and "keep_free" in held["message"]
    for j in jobs[:3]:
        report(svc, j, "running")
    assert svc.run(commands.PreemptJobs()) == []  # one GPU is free: nothing to refill
    # the notebook within guarantee takes the kept GPU at once; the youngest training makes
    # it free again with the class's notice
    nb = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
    assert nb["state"] == "granted"
    svc.store._allocator = None  # rebuilt from the rows: the requests' classes come back
    noticed = svc.run(commands.PreemptJobs())
    assert noticed == [jobs[2]["id"]]
    got = job(svc, jobs[2]["id"])
    assert got["state"] == "preempting" and "keep_free" in got["reason"]
    events = ok(svc.call("root", "GET", "events?kind=job-preempting"))["items"]
    assert [e["data"]["notice"] for e in events] == ["headroom"]
    assert svc.run(commands.PreemptJobs()) == []  # leaving counts: no second notice
    # stopped at its checkpoint, it queues no more (a job's lease ends); its GPU stays free
    assert report(svc, jobs[2], "exited", exit_code=143)["state"] == "preempted"
    assert job(svc, jobs[3]["id"])["state"] == "queued"
    assert lease(svc, jobs[3]["lease_id"])["reason"] == "headroom"
    # a second notebook finds the free GPU at once
    second = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": "b"}), 201)
    assert second["state"] == "granted"


def test_without_the_section_trainings_fill_every_gpu(db_url, clock):
    pool = copy.deepcopy(POOL)
    del pool["borrowing"]
    with service(db_url, clock, pool) as svc:
        assert [submit(svc, f"t{n}")["state"] for n in range(4)] == ["granted"] * 4

"""A pool of two 8-GPU nodes with trainings borrowing them and an 8-GPU training that fits
nowhere: the setting of the long-waiter tests (``PreemptJobs``, the sticky hold, the headroom
views), driven over HTTP through ``InProcessService`` on the store's injectable clock."""

from __future__ import annotations

from typing import Any

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.service.scopes import ADMIN, AGENT, USE
from tests.fakes.clocks import StoreClock
from tests.fakes.service import InProcessService
from tests.fakes.store import make_store

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

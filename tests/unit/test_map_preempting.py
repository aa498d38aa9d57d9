"""A job's preemption notice on the admin panel's map and lease table, on SQLite and
PostgreSQL: a waiter's preemption and the headroom's refill give the job a notice (it is
``preempting`` until its class's grace ends) and leave its lease without one (``GET
allocations/{id}``'s ``reclaim`` stays null: no reclaimer enforces it, nobody extends it), so
the store's reads name it apart (``PreemptingView``) and ``GET pool/map`` says it in each
lease's ``preempting``. Over HTTP through the service's real app and writer on the store's
injectable clock."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.store.read.poolmap import PreemptingView
from tests.fakes import InProcessService, StoreClock
from tests.fakes.jobpool import GRACE, POOL, fill, job, ok, report, service, submit

#: One node of four H100s kept one free of borrowing; the training class's grace is its own.
REFILL_GRACE = 300
HEADROOM: dict[str, Any] = {
    **copy.deepcopy(POOL),
    "nodes": [{**POOL["nodes"][0], "gpus": [{"model": "H100-80GB", "count": 4}]}],
    "classes": {"training": {"grace": REFILL_GRACE}},
    "borrowing": {"keep_free": 1},
}


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    with service(db_url, clock, POOL) as s:
        yield s


def map_entries(svc: InProcessService) -> dict[str, Any]:
    return ok(svc.call("root", "GET", "pool/map"))["leases"]  # type: ignore[no-any-return]


def test_a_waiters_preemption_is_on_the_map_and_the_lease_table_not_on_the_lease(svc, clock):
    on_a, on_b, _ = fill(svc, clock)
    clock.advance(seconds=1801)  # the 8-GPU training now holds node b
    before = {le.id: le for le in svc.store.map_view().leases}
    assert all(le.preempting is None for le in before.values())
    noticed = svc.run(commands.PreemptJobs())
    assert sorted(noticed) == sorted(j["id"] for j in on_b)
    deadline = clock.now + timedelta(seconds=GRACE)
    after = {le.id: le for le in svc.store.map_view().leases}
    table = {le.id: le for le in svc.store.live_leases()}
    for j in on_b:
        reason = job(svc, j["id"])["reason"]
        assert "waited long" in reason
        want = PreemptingView(deadline, reason)
        assert after[j["lease_id"]].preempting == want
        assert after[j["lease_id"]].notice is None  # no lease notice: the job's own
        assert table[j["lease_id"]].preempting == want and table[j["lease_id"]].notice is None
        assert ok(svc.call("root", "GET", f"allocations/{j['lease_id']}"))["reclaim"] is None
    for j in on_a:  # untouched: their views are the very ones built before
        assert after[j["lease_id"]].preempting is None
        assert after[j["lease_id"]] is before[j["lease_id"]]
    entries = map_entries(svc)
    for j in on_b:
        assert entries[j["lease_id"]]["preempting"] == {
            "deadline": deadline.isoformat() + "Z",
            "reason": job(svc, j["id"])["reason"],
        }
    assert {entries[j["lease_id"]]["preempting"] for j in on_a} == {None}
    # stopped at their checkpoint: their leases end, the notices with them
    for j in on_b:
        report(svc, j, "exited", exit_code=143)
    left = svc.store.map_view().leases
    assert not {j["lease_id"] for j in on_b} & {le.id for le in left}
    assert all(le.preempting is None for le in left)


def test_the_headrooms_refill_notice_is_on_the_map_with_its_classs_grace(db_url, clock):
    with service(db_url, clock, HEADROOM) as svc:
        jobs = []
        for n in range(3):
            clock.advance(seconds=1)
            jobs.append(submit(svc, name=f"t{n}"))
            report(svc, jobs[-1], "running")
        nb = ok(svc.call("alice", "POST", "allocations", {"offer": "h100", "server": ""}), 201)
        assert nb["state"] == "granted"  # the kept GPU: one is missing now
        svc.store._allocator = None  # rebuilt from the rows: the requests' classes come back
        assert svc.run(commands.PreemptJobs()) == [jobs[2]["id"]]  # the youngest
        got = job(svc, jobs[2]["id"])
        assert got["state"] == "preempting" and "keep_free" in got["reason"]
        deadline = clock.now + timedelta(seconds=REFILL_GRACE)
        shown = {le.id: le for le in svc.store.map_view().leases}
        assert shown[jobs[2]["lease_id"]].preempting == PreemptingView(deadline, got["reason"])
        assert [le.id for le in shown.values() if le.preempting] == [jobs[2]["lease_id"]]
        entry = map_entries(svc)[jobs[2]["lease_id"]]
        assert entry["notice"] is None
        assert entry["preempting"] == {
            "deadline": deadline.isoformat() + "Z",
            "reason": got["reason"],
        }
        assert got["notice_deadline"].replace("+00:00", "Z") == entry["preempting"]["deadline"]

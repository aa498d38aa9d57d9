"""A long-waiting 8-GPU training preempts, with the notice, the borrowed 1-GPU trainings on
the node held for it (``PreemptJobs`` → ``JobStore.preempt_jobs`` with
``workloads.waiter_preemption_rank``), over HTTP through the service's real app and writer on
the store's injectable clock; with ``classes.training.preempt_for_waiters: false`` it waits."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from datetime import timedelta

import pytest

from jupyterhub_gpupool import orm
from jupyterhub_gpupool.pool import commands
from tests.fakes import InProcessService, StoreClock
from tests.fakes.jobpool import GRACE, POOL, fill, job, ok, report, service


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    with service(db_url, clock, POOL) as s:
        yield s


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

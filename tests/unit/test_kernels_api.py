"""GPU kernel leases over HTTP, through the service's real tornado app and writer on the
store's injectable clock (the hub's token check played by a fake): a kernel's lease granted or
queued with its position, the same kernel asking again, the quota shared with servers, the
provisioner's reports (activation, busy cancelling a notice), the reaper (lost, idle notice,
reclaim), the reconcile leaving kernel leases alone, and another user's kernel as missing."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from jupyterhub_gpupool.dbutil import upgrade
from jupyterhub_gpupool.pool import commands
from jupyterhub_gpupool.pool.kernels import KernelRules, kernel_verdict
from jupyterhub_gpupool.service.scopes import ADMIN, USE
from tests.fakes import InProcessService, StoreClock, make_store

#: Two H100s; alice may hold both, bob one.
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
    "quotas": {"default": {"guarantee": 0, "limit": 1}, "users": {"alice": {"limit": 2}}},
}
RULES = KernelRules(idle_timeout=600, notice=60, report_timeout=120)


def _user(name: str) -> dict[str, Any]:
    return {"kind": "user", "name": name, "scopes": [f"{USE}!user={name}"], "groups": []}


MODELS = {
    "alice": _user("alice"),
    "bob": _user("bob"),
    "root": {"kind": "user", "name": "root", "scopes": [ADMIN], "groups": []},
}


@pytest.fixture
def svc(db_url: str, clock: StoreClock) -> Iterator[InProcessService]:
    upgrade(db_url)
    with InProcessService(make_store(db_url, clock, POOL, kernel_rules=RULES), MODELS) as s:
        yield s


def ok(r: Any, status: int = 200) -> Any:
    assert r.status == status, r.body
    return r.json()


def ask(svc: InProcessService, who: str, kernel: str, offer: str = "h100") -> Any:
    return svc.call(who, "POST", "kernels", {"offer": offer, "kernel_id": kernel})


def report(svc: InProcessService, who: str, kernel: str, state: str = "idle") -> dict[str, Any]:
    return ok(svc.call(who, "POST", f"kernels/{kernel}/activity", {"state": state}))


def test_a_kernel_lease_is_granted_queued_with_position_and_follows_the_queue(svc, clock):
    k1 = ok(ask(svc, "alice", "k1"), 201)
    assert k1["state"] == "granted" and k1["server"] == "kernel:k1" and k1["kernel_id"] == "k1"
    assert k1["expires"] is None and [d["index"] for d in k1["devices"]] == [0]
    assert ok(ask(svc, "alice", "k1"), 201)["lease_id"] == k1["lease_id"]  # a restart keeps it
    other = ask(svc, "alice", "k1", "nope")
    assert other.status == 409 and other.json()["error"]["code"] == "kernel_exists"
    ok(ask(svc, "alice", "k2"), 201)
    waiting = ok(ask(svc, "bob", "k3"), 201)
    assert waiting["state"] == "queued" and waiting["position"] == 1 and waiting["devices"] == []
    # one pool, one quota: a kernel counts like a server
    mine = ok(svc.call("alice", "GET", "kernels"))["kernels"]
    assert sorted(k["kernel_id"] for k in mine) == ["k1", "k2"]
    assert svc.call("bob", "GET", "kernels/k1").status == 404  # not bob's: missing to him
    assert svc.call("bob", "DELETE", "kernels/k1").status == 404
    released = ok(svc.call("alice", "DELETE", "kernels/k1"))
    assert released["state"] == "released" and released["release_reason"] == "stopped"
    granted = ok(svc.call("bob", "GET", "kernels/k3"))
    assert granted["state"] == "granted" and granted["position"] is None
    # bob's quota is one: a second kernel of his waits for quota, not for a GPU
    ok(svc.call("alice", "DELETE", "kernels/k2"))
    over = ask(svc, "bob", "k4")
    over = ok(ask(svc, "bob", "k4"), 201)
    assert over["state"] == "queued" and over["reason"] == "quota"
    assert "1-unit limit" in over["message"]  # the provisioner refuses to start on this


def test_refusals_are_clear(svc):
    r = ask(svc, "alice", "k1", "no-such-offer")
    assert r.status == 422 and r.json()["error"]["code"] == "unknown_offer"
    r = ask(svc, "alice", "bad id!")
    assert r.status in (400, 422) and r.json()["error"]["field"] == "kernel_id"
    ok(ask(svc, "alice", "k1"), 201)
    r = svc.call("alice", "POST", "kernels/k1/activity", {"state": "asleep"})
    assert r.status in (400, 422) and r.json()["error"]["field"] == "state"
    assert svc.call("alice", "POST", "kernels/k9/activity", {"state": "idle"}).status == 404


def test_reports_keep_it_an_idle_kernel_gets_a_notice_then_is_reclaimed(svc, clock):
    ok(ask(svc, "alice", "k1"), 201)
    assert report(svc, "alice", "k1")["state"] == "active"  # the first report activates it
    for _ in range(5):  # 500 s of idle reports: alive, not idle long enough
        clock.advance(seconds=100)
        report(svc, "alice", "k1")
    assert svc.run(commands.ReapKernels()) == []
    clock.advance(seconds=100)  # 600 s without execution: the notice
    report(svc, "alice", "k1")
    assert len(svc.run(commands.ReapKernels())) == 1
    noticed = report(svc, "alice", "k1")
    assert "variables will be lost" in noticed["notice"]["message"]
    assert report(svc, "alice", "k1", "busy")["notice"] is None  # a cell ran: cancelled
    clock.advance(seconds=600)
    report(svc, "alice", "k1")
    svc.run(commands.ReapKernels())
    clock.advance(seconds=61)
    report(svc, "alice", "k1")
    svc.run(commands.ReapKernels())
    gone = report(svc, "alice", "k1")  # the provisioner reads this and shuts the kernel down
    assert gone["state"] == "released" and gone["release_reason"] == "idle"


def test_an_unreported_kernel_is_released_and_reconcile_leaves_reported_ones(svc, clock):
    ok(ask(svc, "alice", "k1"), 201)
    ok(ask(svc, "alice", "k2"), 201)
    report(svc, "alice", "k1")
    report(svc, "alice", "k2")
    assert svc.run(commands.Reconcile(set())) == 0  # no hub server is a kernel's
    clock.advance(seconds=100)
    report(svc, "alice", "k1")
    clock.advance(seconds=30)  # k2: 130 s without a report
    svc.run(commands.ReapKernels())
    lost = ok(svc.call("alice", "GET", "kernels/k2"))
    assert lost["state"] == "released" and lost["release_reason"] == "orphaned"
    assert ok(svc.call("alice", "GET", "kernels/k1"))["state"] == "active"
    assert ok(svc.call("root", "GET", "kernels?user=alice"))["kernels"][0]["kernel_id"] == "k1"


@pytest.mark.parametrize(
    ("now", "report_at", "busy_at", "deadline", "want"),
    [
        (100, 0, 0, None, "keep"),
        (121, 0, 0, None, "lost"),
        (700, 650, 0, None, "notice"),
        (700, 650, 101, None, "keep"),
        (700, 650, 0, 701, "keep"),
        (701, 650, 0, 701, "reclaim"),
        (900, 850, 0, 701, "reclaim"),
    ],
)
def test_kernel_verdict(now, report_at, busy_at, deadline, want):
    assert kernel_verdict(now, report_at, busy_at, deadline, RULES) == want
    if want == "notice":  # idle_timeout 0: never idle-reclaimed
        assert kernel_verdict(now, report_at, busy_at, None, KernelRules(0, 60, 120)) == "keep"


def test_usage_per_kernel(svc, clock):
    ok(ask(svc, "alice", "k1"), 201)
    report(svc, "alice", "k1")
    clock.advance(hours=1)
    report(svc, "alice", "k1")
    ok(svc.call("alice", "DELETE", "kernels/k1"))
    start = (clock.now - timedelta(hours=2)).isoformat() + "Z"
    end = (clock.now + timedelta(minutes=1)).isoformat() + "Z"
    usage = ok(svc.call("root", "GET", f"usage?by=kernel&from={start}&to={end}"))
    rows = {row["kernel"]: row for row in usage["items"]}
    assert rows["kernel:k1"]["kind"] == "kernel" and rows["kernel:k1"]["leases"] == 1
    assert rows["kernel:k1"]["held_unit_hours"] == pytest.approx(1.0)

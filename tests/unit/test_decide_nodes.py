"""Nodes and inventory decided by ``pool.decide``: a drain by a deadline (flags and notices in
one rule), a node's agent gone silent or back, outside marks and rebinding. Each checked on its
effects or refusal, with the allocator left as it was, and, applied in order
(``pool.effects.apply_effect``), leaving it as the allocator's own primitives would (the rows
the applier writes are the store tests' part: ``test_store_operate.py``,
``test_node_reachability.py``, ``test_store_outside.py``)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone

import pytest

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.effects import (
    DrainDeadline,
    GpuCordoned,
    LeaseGranted,
    LeaseNoted,
    LeaseReleased,
    MigCreated,
    MigDestroyed,
    MigFailed,
    MigRowsSet,
    NodeFlagsSet,
    NodeReachable,
    NoticeGiven,
    OutsideSet,
    Rebound,
    RepartitionApplying,
    RepartitionClosed,
    RepartitionOpened,
)
from jupyterhub_gpupool.pool.facts import MigGpu, Repartition
from jupyterhub_gpupool.pool.model import RETIRING, MigInstance
from jupyterhub_gpupool.pool.outside import OutsideHolds, place_outside
from jupyterhub_gpupool.pool.reclaim import Reclaiming, ReclaimState
from jupyterhub_gpupool.pool.repartition import Held as RHeld
from tests.allocrig import A100, apply_all, granted, pool, queued, refusal, req, state_of
from tests.allocrig import decided as decide_pure
from tests.allocrig import lease as facts

#: The drain's deadline: 1000 s after the epoch, as the store's naive UTC times are.
DEADLINE = datetime.fromtimestamp(1000.0, timezone.utc).replace(tzinfo=None)


def full_h(alloc, *states: str) -> tuple:
    """Fill node ``h``'s four H100s with leases h0..h3 (their facts in ``states``)."""
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", server=f"s{i}"), 0))
    return tuple((facts(f"h{i}", s), ReclaimState()) for i, s in enumerate(states))


# -- drain -----------------------------------------------------------------------------------


def test_a_drain_without_a_deadline_is_its_flag():
    out = decide_pure(pool(), c.DrainNode("h"), node_known=True)
    assert out.answer == (0, 0)
    assert out.effects == (NodeFlagsSet("h", "drain", None, True),)


def test_a_drain_by_a_deadline_notices_bound_leases_and_releases_grants_not_elsewhere_served():
    """A bound lease gets the drain notice; a grant not yet bound is released (``admin``) and
    what it frees is not granted on the node being drained; the deadline is audited."""
    alloc, twin = pool(), pool()
    on_node = full_h(alloc, "active", "granted", "reclaiming", "active")
    full_h(twin)
    for a in (alloc, twin):
        queued(a.submit(req("w", "h100", "v", server="sw"), 1.0))
    out = decide_pure(alloc, c.DrainNode("h", DEADLINE, "release-gpu"), 100.0, node_known=True,
                      on_node=on_node)  # fmt: skip
    assert out.answer == (3, 1)
    flags, first, released, *rest, last = out.effects
    assert flags == NodeFlagsSet("h", "drain", None, True)
    assert released == LeaseReleased("h1", "admin", "granted")
    assert not any(isinstance(e, LeaseGranted) for e in out.effects)
    notices = [first, *[e for e in rest if isinstance(e, NoticeGiven)]]
    assert [n.lease_id for n in notices] == ["h0", "h2", "h3"]
    rec = notices[0].state.reclaiming
    assert rec == Reclaiming(
        "drain",
        1000.0,
        "the node h is drained for maintenance by 1970-01-01T00:16:40Z",
        "release-gpu",
        100.0,
    )
    assert last == DrainDeadline("h", 1000.0, 3)
    apply_all(alloc, out.effects, 100.0)
    twin.set_node_flags("h", draining=True)
    twin.release("h1", 100.0)
    assert state_of(alloc) == state_of(twin) and "w" in alloc.waiters


def test_a_drain_leaves_a_lease_already_leaving_and_never_pushes_a_drain_deadline_back():
    alloc = pool()
    earlier = Reclaiming("drain", 500.0, "the node h is drained", "stop", 50.0)
    on_node = (
        (facts("h0", reclaiming=True), ReclaimState()),
        (facts("h1", "reclaiming", reclaim_kind="drain"), ReclaimState(reclaiming=earlier)),
    )
    full_h(alloc)
    out = decide_pure(alloc, c.DrainNode("h", DEADLINE), 100.0, node_known=True, on_node=on_node)
    assert out.answer == (1, 0)
    (notice,) = [e for e in out.effects if isinstance(e, NoticeGiven)]
    assert notice.lease_id == "h1" and notice.state.reclaiming.deadline == 500.0


def test_a_granted_lease_released_by_a_drain_takes_its_pending_target_along():
    alloc = pool()
    full_h(alloc)
    target = facts("h2", "granted", server="s1", resize_of="h1")
    on_node = (
        (facts("h1", "granted", targets=(target,)), ReclaimState()),
        (target, ReclaimState()),
    )
    out = decide_pure(alloc, c.DrainNode("h", DEADLINE), 100.0, node_known=True, on_node=on_node)
    ended = [e for e in out.effects if isinstance(e, LeaseReleased)]
    assert ended == [
        LeaseReleased("h1", "admin", "granted"),
        LeaseReleased("h2", "admin", "granted"),
    ]
    assert out.answer == (0, 1)  # the target ended with its lease: not noticed after it


@pytest.mark.parametrize(
    ("cmd", "known", "code", "field"),
    [
        (c.DrainNode("h", None, "reboot"), True, "invalid_field", "action"),
        (c.DrainNode("h", DEADLINE), True, "invalid_field", "deadline"),
        (c.DrainNode("nope"), False, "not_found", "name"),
    ],
)
def test_drain_refusals(cmd, known, code, field):
    e = refusal(pool(), cmd, 1000.0, node_known=known)
    assert (e.code, e.field) == (code, field)


# -- reachability ----------------------------------------------------------------------------


def test_silent_nodes_take_nothing_new_once_applied():
    alloc = pool()
    out = decide_pure(alloc, c.MarkUnreachable(DEADLINE), silent=("h",))
    assert out.answer == ["h"] and out.effects == (NodeReachable("h", False),)
    apply_all(alloc, out.effects)
    assert alloc.nodes["h"].unreachable
    queued(alloc.submit(req("w", "h100"), 11.0))


def test_a_node_back_takes_grants_at_once():
    alloc, twin = pool(), pool()
    for a in (alloc, twin):
        a.nodes["h"].unreachable = True
        a.set_node_flags("h")
        queued(a.submit(req("w", "h100"), 1.0))
    cmd = c.AddBusy({}, node="h")
    assert decide_pure(alloc, cmd).effects == ()  # its row says it is reachable: nothing
    out = decide_pure(alloc, cmd, unreachable=True)
    assert out.answer is True
    assert out.effects[0] == NodeReachable("h", True)
    assert isinstance(out.effects[1], LeaseGranted) and out.effects[1].grant.node == "h"
    apply_all(alloc, out.effects)
    twin.nodes["h"].unreachable = False
    twin.set_node_flags("h")
    twin.promote(10.0)
    assert state_of(alloc) == state_of(twin)


# -- outside marks ---------------------------------------------------------------------------


def test_outside_marks_are_an_effect_and_take_nothing_new():
    alloc = pool()
    out = decide_pure(alloc, c.SetOutside("h", {"gpu": 3}, ("job-a",)), node_known=True)
    (effect,) = out.effects
    assert isinstance(effect, OutsideSet) and sorted(effect.holds.gpus) == ["h-H1", "h-H2", "h-H3"]
    assert out.answer == effect.holds.to_json()
    apply_all(alloc, out.effects)
    granted(alloc.submit(req("a", "h100"), 11.0))
    queued(alloc.submit(req("b", "h100"), 11.0))


def test_saying_the_marks_there_are_changes_nothing():
    alloc = pool()
    holds = place_outside(alloc.nodes["h"], {"gpu": 1})
    out = decide_pure(alloc, c.SetOutside("h", {"gpu": 1}), node_known=True, outside=holds)
    assert out.effects == () and out.answer == holds.to_json()


def test_a_mark_that_goes_serves_the_queue():
    alloc, twin = pool(), pool()
    holds = place_outside(alloc.nodes["h"], {"gpu": 4})
    for a in (alloc, twin):
        a.set_outside("h", holds)
        queued(a.submit(req("w", "h100"), 1.0))
    out = decide_pure(alloc, c.SetOutside("h", {"gpu": 2}), node_known=True, outside=holds)
    marks, grant = out.effects
    assert isinstance(marks, OutsideSet) and len(marks.holds.gpus) == 2
    assert isinstance(grant, LeaseGranted) and grant.grant.slots[0].gpu == "h-H0"
    apply_all(alloc, out.effects)
    twin.set_outside("h", marks.holds)
    twin.promote(10.0)
    assert state_of(alloc) == state_of(twin)


def test_outside_marks_on_an_unknown_node_are_refused():
    assert refusal(pool(), c.SetOutside("nope", {"gpu": 1})).code == "not_found"


# -- rebind ----------------------------------------------------------------------------------


def test_a_rebind_swaps_with_the_lease_on_the_device_the_server_got():
    alloc = pool()
    granted(alloc.submit(req("a", "h100", server="sa"), 0))  # h-H0
    granted(alloc.submit(req("b", "h100", server="sb"), 0))  # h-H1
    out = decide_pure(alloc, c.Rebind("a", ["h-H1"]), leases={"a": facts("a")})
    (effect,) = out.effects
    assert isinstance(effect, Rebound) and out.answer is True
    assert effect.before == (("b", (alloc.leases["b"].slots[0].key,)),)
    assert sorted(effect.rebinding.others) == ["b"]
    apply_all(alloc, out.effects)
    assert alloc.leases["a"].slots[0].gpu == "h-H1" and alloc.leases["b"].slots[0].gpu == "h-H0"


def test_a_rebind_to_what_the_lease_has_changes_nothing():
    alloc = pool()
    granted(alloc.submit(req("a", "h100"), 0))
    out = decide_pure(alloc, c.Rebind("a", ["h-H0"]), leases={"a": facts("a")})
    assert out == type(out)(False, ())


def test_a_rebind_of_an_ended_lease_or_onto_an_unknown_device_is_refused():
    alloc = pool()
    granted(alloc.submit(req("a", "h100"), 0))
    e = refusal(alloc, c.Rebind("a", ["h-H1"]), leases={"a": facts("a", "released")})
    assert e.code == "not_live"
    e = refusal(alloc, c.Rebind("a", ["GPU-x"]), leases={"a": facts("a")})
    assert e.code == "unknown_device"
    held = OutsideHolds()
    e = refusal(alloc, c.Rebind("a", ["h-H1", "h-H2"]), leases={"a": facts("a")}, outside=held)
    assert e.code == "device_mismatch"


# -- re-partitions ---------------------------------------------------------------------------

SEVEN = [{"profile": "1g.10gb", "start": s} for s in range(7)]


def a100(alloc, **kw) -> MigGpu:
    """GPU ``mig-A0`` of the rig as a re-partition reads its row (what holds it: the
    allocator's leases on it)."""
    gpu = alloc.gpus["mig-A0"]
    held = tuple(RHeld(i.profile, i.start, i.lease, "u") for i in gpu.instances if i.lease)
    return MigGpu("mig-A0", "mig", A100, True, True, False, held=held, **kw)


def rep(state: str = "waiting", method: str = "agent", layout=((("7g.80gb", 0),)), **kw):
    cordoned = kw.pop("was_cordoned", False)
    return Repartition(kw.pop("id", 4), "mig", "mig-A0", layout, method, state, cordoned, **kw)


def test_a_repartition_with_nothing_in_the_way_cordons_the_gpu_and_runs_at_once():
    alloc = pool()
    cmd = c.RequestRepartition("mig", "mig-A0", SEVEN)
    out = decide_pure(alloc, cmd, mig_gpu=a100(alloc))
    opened, cordon, applying = out.effects
    assert isinstance(opened, RepartitionOpened) and opened.method == "agent"
    assert opened.layout == tuple(("1g.10gb", s) for s in range(7)) and not opened.was_cordoned
    assert cordon == GpuCordoned("mig-A0", True)
    assert isinstance(applying, RepartitionApplying) and applying.rep == 0
    assert [(i.profile, i.start, i.lease) for i in applying.instances] == [
        ("1g.10gb", s, None) for s in range(7)
    ]
    assert out.answer["ready"] is True
    apply_all(alloc, out.effects)
    gpu = alloc.gpus["mig-A0"]
    assert gpu.cordoned and len(gpu.instances) == 7
    granted(alloc.submit(req("n", "a100-1g"), 11.0))  # lands on the other GPU, not this one
    assert alloc.leases["n"].slots[0].gpu == "mig-A1"


def test_a_repartition_notices_the_leases_in_the_way_and_releases_a_grant_not_yet_bound():
    """On ``mig-A0``: ``b`` bound (noticed, the re-partition waits for it) and ``g`` granted
    (released now); ``x`` on the other GPU is not in the way."""
    alloc = pool()
    for lid in "bxg":
        granted(alloc.submit(req(lid, "a100-3g", server=f"s{lid}"), 0))
    assert [alloc.leases[lid].slots[0].gpu for lid in "bxg"] == ["mig-A0", "mig-A1", "mig-A0"]
    on_node = (
        (facts("b", "active"), ReclaimState()),
        (facts("g", "granted"), ReclaimState()),
    )
    cmd = c.RequestRepartition("mig", "mig-A0", SEVEN, notice_seconds=600)
    out = decide_pure(alloc, cmd, 100.0, mig_gpu=a100(alloc), on_node=on_node)
    opened, cordon, notice, released = out.effects
    assert isinstance(opened, RepartitionOpened) and cordon == GpuCordoned("mig-A0", True)
    assert isinstance(notice, NoticeGiven) and notice.lease_id == "b"
    rec = notice.state.reclaiming
    assert (rec.kind, rec.deadline, rec.action) == ("admin", 700.0, "stop")
    assert rec.reason == (
        "an administrator re-partitions this GPU's MIG layout by 1970-01-01T00:11:40Z"
    )
    assert released == LeaseReleased("g", "admin", "granted")  # and it waits for b


def test_repartition_refusals():
    alloc = pool()
    cmd = c.RequestRepartition("mig", "mig-A0", SEVEN)
    assert refusal(alloc, cmd).code == "not_found"
    assert refusal(alloc, cmd, mig_gpu=a100(alloc, by_claim=True)).code == "conflict"
    e = refusal(alloc, cmd, mig_gpu=a100(alloc), open_repartition=rep())
    assert e.code == "repartition_pending" and "in progress (#4, waiting)" in e.message
    e = refusal(alloc, c.RequestRepartition("mig", "mig-A0", SEVEN, -1), mig_gpu=a100(alloc))
    assert e.field == "notice_seconds"


def test_a_waiting_repartition_is_cancelled_and_gives_the_gpu_its_cordon_back():
    alloc = pool()
    waiting = rep(was_cordoned=True)
    out = decide_pure(alloc, c.CancelRepartition(4), repartitions=((waiting, a100(alloc)),))
    assert out.effects == (RepartitionClosed(4, "mig-A0", "cancelled", None, True),)
    applying = rep("applying")
    e = refusal(alloc, c.CancelRepartition(4), repartitions=((applying, a100(alloc)),))
    assert e.code == "repartition_applying"
    assert refusal(alloc, c.CancelRepartition(9)).code == "not_found"


def test_advancing_closes_what_the_node_made_fails_what_it_could_not_and_a_gone_gpu():
    alloc = pool()
    made = a100(
        alloc,
        instances=(("7g.80gb", 0, "MIG-1", 0, None),),
        observed=({"profile": "7g.80gb", "start": 0, "uuid": "MIG-1"},),
    )
    not_yet = a100(alloc, instances=(("7g.80gb", 0, None, 0, None),))
    gave_up = a100(alloc, instances=(("7g.80gb", 0, None, 3, "Occupied"),))
    reps = (
        (rep("applying", id=1), made),
        (rep("applying", id=2), not_yet),
        (rep("applying", id=3), gave_up),
        (rep("applying", id=4), None),
    )
    out = decide_pure(alloc, c.AdvanceRepartitions(), repartitions=reps, mig_attempts=3)
    assert out.answer == 3
    assert out.effects == (
        RepartitionClosed(1, "mig-A0", "done", None, False),
        RepartitionClosed(3, "mig-A0", "failed", "the node could not create 7g.80gb@0", False),
        RepartitionClosed(4, "mig-A0", "failed", "the GPU is gone", None),
    )


def test_a_label_repartition_fails_as_mig_manager_says_once():
    alloc = pool()
    applying = ((rep("applying", "label"), a100(alloc)),)
    out = decide_pure(alloc, c.FailRepartition(4, "x" * 3000), repartitions=applying)
    (closed,) = out.effects
    assert closed.state == "failed" and closed.error == "x" * 2000
    done = ((rep("done", "label"), a100(alloc)),)
    assert decide_pure(alloc, c.FailRepartition(4, "again"), repartitions=done).effects == ()


# -- what a node did with its MIG plan ---------------------------------------------------------


def one_grant(alloc) -> tuple:
    """A 1g grant ``g`` planned on ``mig-A0``; the GPU as the rule reads it, and its holders."""
    slot = granted(alloc.submit(req("g", "a100-1g", server="sg"), 0)).slots[0]
    key = ("1g.10gb", slot.start)
    gpu = replace(a100(alloc), held=(), instances=((*key, None, 0, None),), observed=())
    return key, gpu, {("mig-A0", *key): ("g", "granted")}


def result(key, op: str = "create", ok: bool = True, error=None, uuid=None) -> dict:
    return {"gpu": "mig-A0", "op": op, "profile": key[0], "start": key[1], "ok": ok,
            "error": error, "mig_uuid": uuid}  # fmt: skip


def test_a_creation_that_worked_makes_the_grant_ready_and_the_instance_known():
    alloc = pool()
    key, gpu, holders = one_grant(alloc)
    cmd = c.MigResults("mig", [result(key, uuid="MIG-1")])
    out = decide_pure(alloc, cmd, mig_node=(gpu,), mig_holders=holders, leases={"g": facts("g")})
    made, rows = out.effects
    assert made == MigCreated("mig", "mig-A0", *key, "MIG-1", "g", True)
    assert rows.rows == ((*key, "MIG-1", 0, None),)
    assert rows.observed == ({"profile": key[0], "start": key[1], "uuid": "MIG-1",
                              "processes": 0, "attempts": 0},)  # fmt: skip
    assert out.answer == {"accepted": 1}
    apply_all(alloc, out.effects)
    (inst,) = alloc.gpus["mig-A0"].instances
    assert (inst.uuid, inst.lease) == ("MIG-1", "g")


def test_the_last_failed_creation_releases_the_grant():
    alloc = pool()
    key, gpu, holders = one_grant(alloc)
    gpu = replace(gpu, instances=((*key, None, 2, "InsufficientResources"),))
    cmd = c.MigResults("mig", [result(key, ok=False, error="InsufficientResources")])
    lease = facts("g", "granted")
    out = decide_pure(alloc, cmd, mig_node=(gpu,), mig_holders=holders, leases={"g": lease},
                      mig_attempts=3)  # fmt: skip
    failed, noted, rows, released = out.effects
    assert isinstance(failed, MigFailed) and failed.attempt == 3 and failed.lease_id == "g"
    assert "attempt 3 of 3" in failed.message
    assert isinstance(noted, LeaseNoted) and "the grant was released" in noted.message
    assert rows.rows == ((*key, None, 3, "InsufficientResources"),)
    assert released == LeaseReleased("g", "mig-failed", "granted")
    apply_all(alloc, out.effects)
    assert alloc.leases == {} and alloc.gpus["mig-A0"].instances == []


def test_a_destroyed_instance_frees_its_slices_and_the_queue_is_served():
    """``mig-A0`` still has an unwanted 7g (``RETIRING``); the other GPU is full: a 3g waits
    until the node destroys the 7g, then gets ``mig-A0``."""
    alloc = pool()
    seen = {"profile": "7g.80gb", "start": 0, "uuid": "MIG-old", "processes": 0, "attempts": 0}
    apply_all(alloc, (MigRowsSet("mig-A0", (), (seen,), (MigInstance("7g.80gb", 0, "MIG-old",
                                                                    RETIRING),)),))  # fmt: skip
    for lid in ("x", "y"):
        assert granted(alloc.submit(req(lid, "a100-3g", server=lid), 0)).slots[0].gpu == "mig-A1"
    queued(alloc.submit(req("w", "a100-3g", "v", server="sw"), 1.0))
    gpu = replace(a100(alloc), instances=(), observed=(seen,), held=())
    cmd = c.MigResults("mig", [result(("7g.80gb", 0), op="destroy")])
    out = decide_pure(alloc, cmd, mig_node=(gpu,))
    destroyed, rows, grant = out.effects
    assert destroyed == MigDestroyed("mig", "mig-A0", "7g.80gb", 0, None)
    assert rows.observed == () and rows.instances == ()
    assert isinstance(grant, LeaseGranted) and grant.grant.slots[0].gpu == "mig-A0"
    apply_all(alloc, out.effects)
    assert "w" in alloc.leases and alloc.gpus["mig-A0"].instances[0].lease == "w"


def test_mig_results_refusals():
    alloc = pool()
    cmd = c.MigResults("mig", [result(("1g.10gb", 0))])
    assert refusal(alloc, cmd).code == "not_found"
    other = replace(a100(alloc), uuid="mig-A1")
    e = refusal(alloc, cmd, mig_node=(other,))
    assert (e.code, e.field) == ("invalid_field", "results[0].gpu")

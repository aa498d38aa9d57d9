"""GPUs held outside the pool and the device a pod really got (``pool.outside``): the marks
``place_outside`` chooses, the moves ``rebind`` decides, and what the allocator then grants."""

from __future__ import annotations

import pytest

from jupyterhub_gpupool.kube import pods as kp
from jupyterhub_gpupool.pool.allocator import Allocator, Grant, Queued
from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import Refusal
from jupyterhub_gpupool.pool.model import Gpu, MigInstance, Node, Request, parse_offer
from jupyterhub_gpupool.pool.outside import (
    OUTSIDE,
    OutsideHolds,
    mark_exact,
    place_outside,
    rebind,
)
from jupyterhub_gpupool.spawner.objects import LEASE_KEY

CATALOG = default_catalog()
A100 = CATALOG.model("A100-80GB")
H100 = CATALOG.model("H100-80GB")
OFFERS = [
    parse_offer(o, CATALOG)
    for o in (
        {"name": "h100", "kind": "gpu", "models": ["H100-80GB"]},
        {"name": "a100-1g", "kind": "mig", "profile": "1g.10gb", "models": ["A100-80GB"]},
    )
]


def h100s(n: int = 4) -> Node:
    return Node("h", gpus=[Gpu(f"H{i}", i, H100) for i in range(n)])


def a100_sevens() -> Node:
    inst = [MigInstance("1g.10gb", s, f"MIG-{s}") for s in range(7)]
    return Node("m", gpus=[Gpu("A0", 0, A100, mig_enabled=True, instances=inst)])


def grant(alloc: Allocator, rid: str, offer: str = "h100") -> Grant:
    decision = alloc.submit(Request(rid, "u", offer), 0.0)
    assert isinstance(decision, Grant), decision
    return decision


def test_outside_holds_take_the_highest_free_gpus_and_nothing_is_granted_on_them():
    alloc = Allocator([h100s()], OFFERS)
    holds = place_outside(alloc.nodes["h"], {"gpu": 3}, pods=["ml/train-0"])
    assert holds.gpus == ("H3", "H2", "H1") and not holds.short
    alloc.set_outside("h", holds)
    assert grant(alloc, "a").slots[0].gpu == "H0"
    assert isinstance(alloc.submit(Request("b", "u", "h100"), 0.0), Queued)
    # the training pod ends: its GPUs come back
    alloc.set_outside("h", place_outside(alloc.nodes["h"], {}, holds))
    (promoted,) = alloc.promote(0.0)
    assert promoted.request.id == "b" and promoted.slots[0].gpu != "H0"


def test_marks_stay_where_they_were_and_a_shortfall_is_said():
    alloc = Allocator([h100s(2)], OFFERS)
    first = place_outside(alloc.nodes["h"], {"gpu": 1})
    assert first.gpus == ("H1",)
    alloc.set_outside("h", first)
    grant(alloc, "a")  # H0
    again = place_outside(alloc.nodes["h"], {"gpu": 1}, first)
    assert again == first  # unchanged: nothing to write
    # a second outside pod got bound before the pool's pod: no free GPU is left to mark
    more = place_outside(alloc.nodes["h"], {"gpu": 2}, first)
    assert more.gpus == ("H1",) and more.short == {"gpu": 1}


def test_mig_instances_held_outside_are_occupied_and_freed():
    alloc = Allocator([a100_sevens()], OFFERS)
    holds = place_outside(alloc.nodes["m"], {"1g.10gb": 6})
    alloc.set_outside("m", holds)
    held = [i.start for i in alloc.nodes["m"].gpus[0].instances if i.lease == OUTSIDE]
    assert held == [1, 2, 3, 4, 5, 6]
    assert grant(alloc, "a", "a100-1g").slots[0].start == 0
    assert isinstance(alloc.submit(Request("b", "u", "a100-1g"), 0.0), Queued)
    assert OutsideHolds.from_json(holds.to_json()) == holds  # the row's JSON round-trips


def test_rebind_moves_the_lease_to_the_device_the_plugin_gave():
    alloc = Allocator([h100s(2)], OFFERS)
    lease = grant(alloc, "a")
    assert lease.slots[0].gpu == "H0"
    node = alloc.nodes["h"]
    result = rebind("a", alloc.leases["a"].slots, ["H1"], node, {})
    assert result.moved == (("H0", "H1"),) and result.slots[0].gpu == "H1"
    alloc.rebind("a", result, "h")
    assert node.gpus[1].whole_lease == "a" and node.gpus[0].whole_lease is None
    # the same answer again changes nothing
    assert not rebind("a", alloc.leases["a"].slots, ["H1"], node, {}).changed


def test_rebind_swaps_with_the_lease_or_outside_mark_that_held_the_device():
    alloc = Allocator([h100s(3)], OFFERS)
    grant(alloc, "a"), grant(alloc, "b")  # H0, H1
    node = alloc.nodes["h"]
    held = {"b": alloc.leases["b"].slots}
    result = rebind("a", alloc.leases["a"].slots, ["H1"], node, held)
    assert result.others == {"b": (alloc.leases["a"].slots[0],)}
    alloc.rebind("a", result, "h")
    assert [g.whole_lease for g in node.gpus] == ["b", "a", None]
    # an outside mark on H2: the lease moving there leaves the mark on its old device
    marks = OutsideHolds({"gpu": 1}, ("H2",))
    alloc.set_outside("h", marks)
    result = rebind(
        "a", alloc.leases["a"].slots, ["H2"], node, {"b": alloc.leases["b"].slots}, marks
    )
    assert result.outside.gpus == ("H1",)
    alloc.rebind("a", result, "h")
    assert [(g.whole_lease, g.outside) for g in node.gpus] == [
        ("b", False),
        (None, True),
        ("a", False),
    ]


def test_rebind_refuses_what_is_not_a_device_of_the_lease_kind():
    alloc = Allocator([h100s(2), a100_sevens()], OFFERS)
    grant(alloc, "a")
    slots = alloc.leases["a"].slots
    with pytest.raises(Refusal) as e:
        rebind("a", slots, ["GPU-elsewhere"], alloc.nodes["h"], {})
    assert e.value.code == "unknown_device"
    with pytest.raises(Refusal) as e:
        rebind("a", slots, ["H0", "H1"], alloc.nodes["h"], {})
    assert e.value.code == "device_mismatch"
    grant(alloc, "m", "a100-1g")
    with pytest.raises(Refusal) as e:  # a MIG lease names MIG devices, not the GPU
        rebind("m", alloc.leases["m"].slots, ["A0"], alloc.nodes["m"], {})
    assert e.value.code == "unknown_device"
    got = rebind("m", alloc.leases["m"].slots, ["MIG-5"], alloc.nodes["m"], {})
    assert got.slots[0].start == 5 and got.slots[0].gpu == "A0"


def pod(name, node, limits, *, lease=None, phase="Running", init=None):
    meta = {"name": name, "namespace": "ml"}
    if lease:
        meta["annotations"] = {kp.LEASE_ANNOTATION: lease}
    spec = {"nodeName": node, "containers": [{"name": "c", "resources": {"limits": limits}}]}
    if init:
        spec["initContainers"] = [{"name": "i", "resources": {"limits": init}}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_pods_outside_the_pool_are_counted_per_node_and_resource():
    assert kp.LEASE_ANNOTATION == LEASE_KEY  # the spawner's annotation is what is read
    pods = [
        pod("train-0", "h", {"nvidia.com/gpu": "2"}),
        pod("jupyter-alice", "h", {"nvidia.com/gpu": "1"}, lease="L1"),  # the pool's own
        pod("stale", "h", {"nvidia.com/gpu": "1"}, lease="L-gone"),  # its lease ended: outside
        pod("done", "h", {"nvidia.com/gpu": "1"}, phase="Succeeded"),
        pod("infer", "m", {"nvidia.com/mig-1g.10gb": "1"}, init={"nvidia.com/mig-1g.10gb": "2"}),
        pod("cpu", "h", {"cpu": "1"}),
        pod("elsewhere", "other", {"nvidia.com/gpu": "8"}),
    ]
    got = kp.outside_of(pods, {"h": [], "m": ["1g.10gb"]}, live={"L1"})
    assert got["h"] == ({"gpu": 3}, ["ml/train-0", "ml/stale"])
    assert got["m"] == ({"1g.10gb": 2}, ["ml/infer"])
    assert "other" not in got
    node = {"status": {"allocatable": {"nvidia.com/gpu": "3"}}}
    assert kp.unadvertised(node, 4) == 1 and kp.unadvertised(node, 3) == 0


def test_a_share_moves_to_the_gpu_of_its_replica_while_there_is_room():
    shared = parse_offer({"name": "quarter", "kind": "shared", "fraction": 0.75}, CATALOG)
    alloc = Allocator([h100s(2)], [*OFFERS, shared])
    grant(alloc, "s", "quarter")
    grant(alloc, "t", "quarter")
    node = alloc.nodes["h"]
    assert [sorted(g.shares) for g in node.gpus] == [["s"], ["t"]]
    with pytest.raises(Refusal) as e:  # GPU 1 has a quarter left: no room for three
        rebind("s", alloc.leases["s"].slots, ["H1::3"], node, {"t": alloc.leases["t"].slots})
    assert e.value.code == "device_held"
    alloc.release("t", 0.0)
    moved = rebind("s", alloc.leases["s"].slots, ["H1::3"], node, {})
    alloc.rebind("s", moved, "h")
    assert [dict(g.shares) for g in node.gpus] == [{}, {"s": 750}]


# -- exact marks (DRA) ---------------------------------------------------------------------------


def test_exact_marks_take_the_named_devices_and_say_who_holds_them():
    alloc = Allocator([h100s(3), a100_sevens()], OFFERS)
    holds = mark_exact(alloc.nodes["h"], [("H0", None, "ml/train-gpu"), ("elsewhere", None, "x")])
    assert holds.gpus == ("H0",) and holds.counts == {"gpu": 1} and not holds.short
    assert holds.by == {"H0": "ml/train-gpu"} and holds.pods == ("ml/train-gpu",)
    alloc.set_outside("h", holds)
    assert alloc.nodes["h"].gpus[0].outside_by == ("ml/train-gpu",)
    assert grant(alloc, "a").slots[0].gpu == "H1"  # not the lowest: that one is taken
    mig = mark_exact(alloc.nodes["m"], [("A0", 2, "serve/infer"), ("A0", 9, "no such place")])
    assert mig.instances == (("A0", 2),) and mig.counts == {"1g.10gb": 1}
    assert mig.by == {"A0@2": "serve/infer"}
    alloc.set_outside("m", mig)
    starts = sorted(grant(alloc, f"m{i}", "a100-1g").slots[0].start or 0 for i in range(6))
    assert starts == [0, 1, 3, 4, 5, 6]
    # the claim is gone: its device comes back
    alloc.set_outside("m", mark_exact(alloc.nodes["m"], []))
    assert grant(alloc, "last", "a100-1g").slots[0].start == 2


def test_a_whole_gpu_held_outside_takes_every_free_instance_of_a_mig_gpu():
    alloc = Allocator([a100_sevens()], OFFERS)
    mine = grant(alloc, "a", "a100-1g")
    holds = mark_exact(alloc.nodes["m"], [("A0", None, "ml/whole")])
    assert len(holds.instances) == 6 and (("A0", mine.slots[0].start)) not in holds.instances
    assert holds.short == {"1g.10gb": 1} and len(holds.conflicts) == 1


def test_a_device_a_lease_holds_is_a_conflict_not_a_mark():
    alloc = Allocator([h100s(2)], OFFERS)
    mine = grant(alloc, "a")
    holds = mark_exact(alloc.nodes["h"], [(mine.slots[0].gpu, None, "ml/train-gpu")])
    assert holds.gpus == () and holds.short == {"gpu": 1}
    assert holds.conflicts == (f"GPU {mine.slots[0].gpu} is held by ml/train-gpu and by lease a",)
    again = OutsideHolds.from_json(holds.to_json())
    assert again == holds and not again.empty  # a conflict alone is still worth a row
    assert OutsideHolds.from_json(OutsideHolds().to_json()).to_json() == OutsideHolds().to_json()

"""An agent's inventory decided (``pool.rules.inventory``): the effects, checked to change
nothing when decided, and the allocator they leave once applied (``pool.nodeput.put_node``)
compared with one made from scratch with the same nodes and leases."""

from __future__ import annotations

from dataclasses import replace

from jupyterhub_gpupool.pool import commands as c
from jupyterhub_gpupool.pool.allocator import Allocator
from jupyterhub_gpupool.pool.effects import (
    InventoryTaken,
    LeaseGranted,
    LeaseNoted,
    LeaseReleased,
    MigFailed,
    NodeReachable,
    NodeReported,
)
from jupyterhub_gpupool.pool.facts import NodeRows
from jupyterhub_gpupool.pool.model import MigInstance, Node
from tests.allocrig import (
    apply_all,
    decided,
    granted,
    h100_node,
    lease,
    mig_node,
    offers,
    pool,
    queued,
    refusal,
    req,
    rows_of,
    state_of,
)

KNOWN = ("default",)


def facts(alloc: Allocator, states: dict[str, str] | None = None) -> dict:
    states = states or {}
    return {lid: lease(lid, states.get(lid, "active")) for lid in alloc.leases}


def inventory(alloc: Allocator, node: Node, rows: NodeRows | None, **kw):
    return decided(alloc, c.PutInventory(node, actor="agent"), clusters=KNOWN, node_rows=rows, **kw)


def from_scratch(alloc: Allocator) -> Allocator:
    """An allocator made with the same nodes (nothing held) and the same leases and waiters,
    as a rebuild makes one."""
    nodes = [
        replace(
            n,
            gpus=[
                replace(
                    g,
                    instances=[replace(i, lease=None) for i in g.instances],
                    whole_lease=None,
                    shares={},
                )
                for g in n.gpus
            ],
            cpu_used=0,
            memory_used=0,
        )
        for n in alloc.nodes.values()
    ]
    out = Allocator(nodes, offers())
    for le in alloc.leases.values():
        out.restore(le)
    for w in alloc.waiters.values():
        out.restore_waiter(w)
    return out


def test_a_new_node_serves_a_waiter():
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", f"u{i}"), 1.0))
    queued(alloc.submit(req("w", "h100", "w"), 2.0))
    out = inventory(alloc, h100_node("h2", 1), None)
    assert [type(e) for e in out.effects] == [NodeReported, LeaseGranted, InventoryTaken]
    assert out.effects[1].grant.node == "h2" and out.effects[-1] == InventoryTaken("h2", 1, "agent")
    apply_all(alloc, out.effects)
    assert alloc.leases["w"].node == "h2" and "h2-H0" in alloc.gpus
    assert state_of(alloc) == state_of(from_scratch(alloc))


def test_a_gpu_gone_ends_its_lease_node_lost_and_the_node_keeps_the_rest():
    alloc = pool()
    held = granted(alloc.submit(req("a", "h100"), 1.0))
    gone = held.slots[0].gpu
    kept = granted(alloc.submit(req("b", "h100", "v"), 1.0))
    node = h100_node()
    node.gpus = [g for g in node.gpus if g.uuid != gone]
    out = inventory(alloc, node, rows_of(alloc, "h"), leases=facts(alloc))
    assert out.effects[0] == LeaseReleased("a", "node-lost", "active")
    assert isinstance(out.effects[1], NodeReported)
    apply_all(alloc, out.effects)
    assert gone not in alloc.gpus and "a" not in alloc.leases
    assert alloc.leases["b"].slots == kept.slots
    assert alloc.gpus[kept.slots[0].gpu].whole_lease == "b"
    assert state_of(alloc) == state_of(from_scratch(alloc))


def test_a_gpu_switched_to_mig_loses_its_lease():
    alloc = pool()
    held = granted(alloc.submit(req("a", "h100"), 1.0))
    node = h100_node()
    switched = held.slots[0].gpu
    node.gpus = [replace(g, mig_enabled=g.uuid == switched) for g in node.gpus]
    out = inventory(alloc, node, rows_of(alloc, "h"), leases=facts(alloc))
    assert out.effects[0] == LeaseReleased("a", "node-lost", "active")
    apply_all(alloc, out.effects)
    assert alloc.gpus[switched].mig_enabled and "a" not in alloc.leases
    assert state_of(alloc) == state_of(from_scratch(alloc))


def test_a_vanished_instance_loses_its_bound_lease():
    alloc = pool()
    held = granted(alloc.submit(req("m", "a100-1g"), 1.0))
    slot = held.slots[0]
    gpu = alloc.gpus[slot.gpu]
    for i in gpu.instances:
        i.uuid = "MIG-m" if i.lease == "m" else i.uuid
    seen = ({"profile": slot.profile, "start": slot.start, "uuid": "MIG-m"},)
    rows = rows_of(alloc, "mig", **{f"observed:{slot.gpu}": seen})
    out = inventory(alloc, mig_node(), rows, leases=facts(alloc))
    assert out.effects[0] == LeaseReleased("m", "node-lost", "active")
    reported = next(e for e in out.effects if isinstance(e, NodeReported))
    assert reported.rows[0] == () and reported.observed[0] == ()
    apply_all(alloc, out.effects)
    assert "m" not in alloc.leases and alloc.gpus[slot.gpu].instances == []


def test_a_creation_a_busy_instance_blocks_is_given_up():
    alloc = pool()
    held = granted(alloc.submit(req("m", "a100-1g"), 1.0))
    slot = held.slots[0]
    node = mig_node()
    busy = MigInstance("7g.80gb", 0, "MIG-busy", processes=1)
    node.gpus[0].instances = [busy] if node.gpus[0].uuid == slot.gpu else []
    rows = rows_of(alloc, "mig", m="granted")
    out = inventory(alloc, node, rows, leases=facts(alloc, {"m": "granted"}))
    kinds = [type(e) for e in out.effects]
    assert kinds == [NodeReported, MigFailed, LeaseNoted, LeaseReleased, InventoryTaken]
    failed = out.effects[1]
    assert failed.system and failed.lease_id == "m" and failed.error == "Occupied"
    assert out.effects[3] == LeaseReleased("m", "mig-failed", "granted")
    assert out.effects[0].rows[0] == ()  # the instance made for it goes with it
    apply_all(alloc, out.effects)
    assert "m" not in alloc.leases
    assert [(i.profile, i.lease) for i in alloc.gpus[slot.gpu].instances] == [
        ("7g.80gb", "~retiring")
    ]


def test_a_gpu_of_another_node_is_refused():
    alloc = pool()
    err = refusal(
        alloc, c.PutInventory(h100_node("h2", 1)), clusters=KNOWN, elsewhere={"h2-H0": "h"}
    )
    assert (err.code, err.field) == ("gpu_elsewhere", "uuid")
    assert err.message == "uuid: GPU h2-H0 belongs to node h"


def test_an_unknown_cluster_is_refused():
    err = refusal(pool(), c.PutInventory(Node("x", "mars")), clusters=KNOWN)
    assert (err.code, err.field, err.allowed) == ("unknown_cluster", "cluster", ["default"])


def test_a_node_back_from_unreachable_takes_the_waiter():
    alloc = pool()
    for i in range(4):
        granted(alloc.submit(req(f"h{i}", "h100", f"u{i}"), 1.0))
    alloc.release("h0", 1.5)
    alloc.nodes["h"].unreachable = True
    alloc.set_node_flags("h")
    queued(alloc.submit(req("w", "h100", "w"), 2.0))
    rows = rows_of(alloc, "h", unreachable=True)
    out = inventory(alloc, h100_node(), rows, leases=facts(alloc))
    assert out.effects[0] == NodeReachable("h", True)
    assert [type(e) for e in out.effects[1:]] == [NodeReported, LeaseGranted, InventoryTaken]
    apply_all(alloc, out.effects)
    assert not alloc.nodes["h"].unreachable and alloc.leases["w"].node == "h"
    assert state_of(alloc) == state_of(from_scratch(alloc))

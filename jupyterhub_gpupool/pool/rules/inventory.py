"""What the cluster says about a node's devices: held outside the pool (``SetOutside``), and
the devices a lease's server really got (``Rebind``); the rules are ``pool.outside``'s."""

from __future__ import annotations

from typing import Any

from .. import commands as c
from ..effects import Effect, LeaseGranted, OutsideSet, Rebound, WaitReason
from ..errors import Refusal
from ..facts import Outcome, PoolState, Rule
from ..leases import LIVE_STATES
from ..outside import mark_exact, place_outside, rebind
from ..trial import Trial


def _set_outside(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Pods the pool did not place hold ``cmd.counts`` devices of the node: mark that many
    (``place_outside``, the marks now ``state.outside`` first), or with ``cmd.devices`` (DRA)
    exactly those (``mark_exact``). When marks go away, the queue is served with what they
    free. Answers the marks (``OutsideHolds.to_json``)."""
    node = state.alloc.nodes.get(cmd.node)
    if not state.node_known or node is None:
        raise Refusal("not_found", f"no node {cmd.node!r}", field="node")
    before = state.outside
    if cmd.devices is None:
        after = place_outside(node, cmd.counts, before, cmd.pods)
    else:
        after = mark_exact(node, cmd.devices)
    if after == before:
        return Outcome(after.to_json())
    effects: list[Effect] = [OutsideSet(cmd.node, after)]
    if len(after.gpus) + len(after.instances) < len(before.gpus) + len(before.instances):
        with Trial(state.alloc) as trial:  # a device came back: whoever waits may have it
            trial.set_outside(cmd.node, after)
            effects += [LeaseGranted(g) for g in trial.promote(now)]
            effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(after.to_json(), tuple(effects))


def _rebind(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The lease's server runs on ``cmd.devices`` of its node, not on what the pool chose
    (``pool.outside.rebind``; the lease's row is ``state.leases[cmd.lease_id]``, the node's
    marks ``state.outside``): the lease holds those from now on, and what held them takes
    what it leaves. Saying what it has already changes nothing. Answers whether it moved."""
    facts = state.leases[cmd.lease_id]
    lease = state.alloc.leases.get(cmd.lease_id)
    if facts.state not in LIVE_STATES or lease is None:
        raise Refusal("not_live", f"lease {cmd.lease_id} is {facts.state}", field="id")
    if not lease.slots:
        raise Refusal("device_mismatch", f"lease {cmd.lease_id} holds no GPU", field="device")
    node = state.alloc.nodes[lease.node]
    held = {
        other.id: other.slots
        for other in state.alloc.leases.values()
        if other.node == node.name and other.id != cmd.lease_id
    }
    result = rebind(
        cmd.lease_id, lease.slots, cmd.devices, node, held, state.outside, cmd.exclusive
    )
    if not result.changed:
        return Outcome(False)
    before = tuple((lid, tuple(s.key for s in held[lid])) for lid in sorted(result.others))
    moved = Rebound(cmd.lease_id, node.name, tuple(cmd.devices), result, before)
    return Outcome(True, (moved,))


RULES: dict[type[c.Command], Rule] = {
    c.SetOutside: _set_outside,
    c.Rebind: _rebind,
}

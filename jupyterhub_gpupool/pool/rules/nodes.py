"""Nodes: cordon, uncordon and drain flags (a drain by a deadline with its notices), a node's
agent gone silent or back, and the sharing modes a node's GPUs advertise."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

from ...timeparse import format_time
from .. import commands as c
from ..effects import (
    DrainDeadline,
    Effect,
    LeaseGranted,
    NodeFlagsSet,
    NodeReachable,
    SharingSet,
    WaitReason,
)
from ..ending import notices_in, uncordon_withdrawals
from ..errors import Refusal
from ..facts import Outcome, PoolState, Rule
from ..model import SHARING_MODES
from ..reclaim import Reclaiming
from ..trial import Trial
from .notices import ADMIN_ACTIONS

#: What each node action sets (cordoned: takes nothing new; draining: the same, and says why).
NODE_ACTIONS: Mapping[str, Mapping[str, bool]] = {
    "cordon": {"cordoned": True},
    "uncordon": {"cordoned": False, "draining": False},
    "drain": {"draining": True},
}


def _set_node(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Cordon, uncordon or drain a node (it keeps its leases either way). An uncordon gives
    the queue the node's room at once and withdraws the drain notices of its leases that no
    one is carrying out yet (``state.drained``); answers their ids."""
    flags = NODE_ACTIONS.get(cmd.action)
    if flags is None:
        raise Refusal(
            "not_found",
            f"no node action {cmd.action!r}",
            field="action",
            allowed=list(NODE_ACTIONS),
        )
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    cordoned, draining = flags.get("cordoned"), flags.get("draining")
    effects: list[Effect] = [NodeFlagsSet(cmd.name, cmd.action, cordoned, draining)]
    if cmd.action != "uncordon":
        return Outcome([], tuple(effects))
    with Trial(state.alloc) as trial:
        trial.set_node_flags(cmd.name, cordoned, draining)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    withdrawn = uncordon_withdrawals(cmd.name, state.drained, now)
    return Outcome([e.lease_id for e in withdrawn], (*effects, *withdrawn))


def _set_sharing(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A node's GPUs' sharing modes as its device plugin advertises them (uuid → mode; a MIG
    GPU's and an unnamed one's stay): leases keep what they hold, and the queue is served
    (a GPU now shared may take waiters). Answers what changed."""
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    changed: dict[str, str] = {}
    for uuid, sharing, mig in state.node_gpus:
        mode = cmd.modes.get(uuid)
        if mode is None or mode == sharing or mig:
            continue
        if mode not in SHARING_MODES:
            raise Refusal("invalid_field", f"unknown sharing mode {mode!r}")
        changed[uuid] = mode
    if not changed:
        return Outcome(changed)
    effects: list[Effect] = [SharingSet(cmd.name, tuple(changed.items()))]
    with Trial(state.alloc) as trial:
        for uuid, mode in changed.items():
            trial.set_gpu_sharing(uuid, mode)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(changed, tuple(effects))


def _drain_node(state: PoolState, cmd: Any, now: float) -> Outcome:
    """Drain a node: nothing new lands there (``SetNode``'s flags); with a deadline, each of
    its live leases (``state.on_node``) not already leaving gets a ``drain`` notice ending
    then (``pool.ending``'s enforced notice: a grant not yet bound is released now, the queue
    served elsewhere). Answers (noticed, released)."""
    if cmd.action not in ADMIN_ACTIONS:
        raise Refusal(
            "invalid_field",
            f"unknown action {cmd.action!r}",
            field="action",
            allowed=ADMIN_ACTIONS,
        )
    deadline = None if cmd.deadline is None else _epoch(cmd.deadline)
    if deadline is not None and deadline <= now:
        raise Refusal("invalid_field", "the deadline has passed", field="deadline")
    if not state.node_known:
        raise Refusal("not_found", f"no node {cmd.name!r}", field="name")
    effects: list[Effect] = [NodeFlagsSet(cmd.name, "drain", None, True)]
    if deadline is None:
        return Outcome((0, 0), tuple(effects))
    why = f"the node {cmd.name} is drained for maintenance by {format_time(cmd.deadline)}"
    notice = Reclaiming("drain", deadline, why, cmd.action, now)
    with Trial(state.alloc) as trial:
        trial.set_node_flags(cmd.name, None, True)
        noticed, released = notices_in(trial, state.on_node, notice, now, effects)
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    effects.append(DrainDeadline(cmd.name, deadline, noticed))
    return Outcome((noticed, released), tuple(effects))


def _mark_unreachable(state: PoolState, cmd: Any, now: float) -> Outcome:
    """The nodes whose agents went silent (``state.silent``) take no new grants; their leases
    stay until an administrator or the node decides. Answers their names."""
    return Outcome(list(state.silent), tuple(NodeReachable(n, False) for n in state.silent))


def _add_busy(state: PoolState, cmd: Any, now: float) -> Outcome:
    """A node's agent reports (its busy time): an unreachable node (``state.unreachable``)
    takes grants again, and the queue is served. The busy time itself is the agent's report,
    written as it comes (no decision). Answers whether the node came back."""
    if cmd.node is None or not state.unreachable:
        return Outcome(False)
    effects: list[Effect] = [NodeReachable(cmd.node, True)]
    with Trial(state.alloc) as trial:
        if cmd.node in state.alloc.nodes:
            trial.set_reachable(cmd.node, True)
        effects += [LeaseGranted(g) for g in trial.promote(now)]
        effects += [WaitReason(lid, why) for lid, why in trial.reasons()]
    return Outcome(True, tuple(effects))


def _epoch(dt: datetime) -> float:
    """Epoch seconds of a time (a naive one is UTC, as the store keeps it)."""
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


RULES: dict[type[c.Command], Rule] = {
    c.SetNode: _set_node,
    c.SetSharing: _set_sharing,
    c.DrainNode: _drain_node,
    c.MarkUnreachable: _mark_unreachable,
    c.AddBusy: _add_busy,
}
